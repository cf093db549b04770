"""The index's work as the server counts it, from a side connection to the Redis/Valkey server.

A run's index calls go over three named connections (``client_name`` in the URL): the router's
lookups, the modelled nodes' registrations, heartbeats, publishes and deregistrations, and the
membership's listings of the live nodes. ``CLIENT LIST`` gives each connection's commands
(scripts' inner ``redis.call``s included), bytes received and bytes sent; ``INFO commandstats``
the server's calls and microseconds per command (again with scripts' inner calls), less this
side connection's own INFO and CLIENT calls; ``INFO memory`` the server's used memory.
"""

from __future__ import annotations

import redis

CLIENTS = {"router": "sim-router", "nodes": "sim-nodes", "membership": "sim-membership"}
_OWN_COMMANDS = ("cmdstat_info", "cmdstat_client|list", "cmdstat_client|setname", "cmdstat_hello", "cmdstat_ping")


def named_url(url: str, client: str) -> str:
    """``url`` for one of CLIENTS' connections."""
    return f"{url}{'&' if '?' in url else '?'}client_name={CLIENTS[client]}"


class ServerStats:
    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url, decode_responses=True)

    def snapshot(self) -> dict:
        commands = {
            name: (int(stats["calls"]), int(stats["usec"]))
            for name, stats in self._client.info("commandstats").items()
            if name not in _OWN_COMMANDS
        }
        clients: dict[str, tuple[int, int, int]] = {}
        for entry in self._client.client_list():
            for key, name in CLIENTS.items():
                if entry.get("name") == name:  # a client may hold several connections (the lookup's own, the pool's)
                    counts = (int(entry["tot-cmds"]), int(entry["tot-net-in"]), int(entry["tot-net-out"]))
                    clients[key] = tuple(a + b for a, b in zip(clients.get(key, (0, 0, 0)), counts, strict=True))
        return {"commands": commands, "clients": clients, "used_memory": int(self._client.info("memory")["used_memory"])}

    def close(self) -> None:
        self._client.close()


def delta(before: dict, after: dict, per: int) -> dict:
    """Work between two snapshots, divided by ``per`` (requests, or lookups)."""
    per = max(1, per)
    calls = sum(c for c, _ in after["commands"].values()) - sum(c for c, _ in before["commands"].values())
    usec = sum(u for _, u in after["commands"].values()) - sum(u for _, u in before["commands"].values())
    by_client = {}
    for key in CLIENTS:
        old = before["clients"].get(key, (0, 0, 0))
        new = after["clients"].get(key, old)
        by_client[key] = {
            "commands": (new[0] - old[0]) / per,
            "bytes_in": (new[1] - old[1]) / per,
            "bytes_out": (new[2] - old[2]) / per,
        }
    return {
        "server_commands": calls / per,
        "server_usec": usec / per,
        "bytes": sum(c["bytes_in"] + c["bytes_out"] for c in by_client.values()),
        "by_client": by_client,
    }


def top_commands(before: dict, after: dict, per: int, limit: int = 6) -> dict[str, float]:
    """The commands the server ran most between two snapshots, calls per ``per``."""
    counts = {name: calls - before["commands"].get(name, (0, 0))[0] for name, (calls, _) in after["commands"].items()}
    ranked = sorted(((n, c) for n, c in counts.items() if c > 0), key=lambda item: -item[1])[:limit]
    return {name.removeprefix("cmdstat_"): calls / max(1, per) for name, calls in ranked}
