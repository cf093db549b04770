"""First-token work waiting on this host: a board that encoder and prefill nodes sharing the
host's cores write their queues to, and that a decode node on the same cores reads.

Why: where the roles share cores (the one-command stack), every core-second a decode node spends
stepping its streams is one the encoder and prefill nodes do not get. While requests queue for
their first token, a decode node stepping a batch of one or two flat out (each step reads every
weight, however few its rows) lengthens that queue for little. vLLM's scheduler runs waiting
prefills before decodes; the decode node here yields instead, stepping at a bounded pace while the
board shows a backlog (shared/colocation/step_pacing.py has the rule). On its own cores (pinned, or
another host) a decode node has nothing to yield to and gets no board.

Layout: a file of ``num_slots`` records of three little-endian int64s, (pid, calls waiting,
prompts ready), one per colocated compute process, handed out by the launcher (``BOARD_VAR``,
``SLOT_VAR``). Calls waiting: the calls a node admitted and has not answered, some of them waiting
on other nodes (a prefill on its encodes). Prompts ready: the prompts a prefill node could compute
now (in its engine). A writer stamps its pid with each count, so a reader skips the slot of a
process that died (a restarted role takes its slot back with its first post). Reads are not
locked: a count is one aligned 8-byte store, and a torn read costs at most one step at the wrong
pace.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

BOARD_VAR = "TESSERA_BACKLOG_BOARD"  # the board file's path
SLOT_VAR = "TESSERA_BACKLOG_SLOT"  # this process's slot on it (writers only)
RECORD = struct.Struct("<qqq")  # pid, calls waiting, prompts ready
_INT64 = struct.Struct("<q")
WRITER_ROLES = frozenset({"encoder", "prefill"})  # the roles whose calls end in a first token
_BOARD_PREFIX = "tessera-backlog-"  # then the maker's pid, "-", a unique suffix


def create_board(path: Path, num_slots: int) -> Path:
    """An empty board of ``num_slots`` slots at ``path`` (replacing any there)."""
    if num_slots < 1:
        raise ValueError(f"a board needs at least one slot, got {num_slots}")
    path.write_bytes(bytes(RECORD.size * num_slots))
    return path


def new_board(num_slots: int, directory: Path | None = None) -> Path:
    """An empty board in a new file, memory-backed where the host has /dev/shm (it is read at
    every decode step), named for its maker's pid. Its maker removes it; a maker killed outright
    cannot, so each new board first removes the boards of makers that are gone (/dev/shm is
    memory, and outlives every process)."""
    if directory is None:
        shm = Path("/dev/shm")
        directory = shm if shm.is_dir() else Path(tempfile.gettempdir())
    remove_orphaned_boards(directory)
    fd, name = tempfile.mkstemp(prefix=f"{_BOARD_PREFIX}{os.getpid()}-", dir=directory)
    os.close(fd)
    return create_board(Path(name), num_slots)


def remove_orphaned_boards(directory: Path) -> None:
    """Remove the boards in ``directory`` whose maker is gone."""
    for path in directory.glob(f"{_BOARD_PREFIX}*-*"):
        pid = path.name.removeprefix(_BOARD_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


class BacklogBoard:
    def __init__(self, path: Path) -> None:
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
        if len(self._map) == 0 or len(self._map) % RECORD.size:
            raise ValueError(f"{path} is not a backlog board ({len(self._map)} bytes)")
        self.num_slots = len(self._map) // RECORD.size

    def post(self, slot: int, num_waiting: int) -> None:
        self._post(slot, 1, num_waiting)

    def post_ready(self, slot: int, num_ready: int) -> None:
        self._post(slot, 2, num_ready)

    def max_waiting(self) -> int:
        """The longest queue posted by a live process (0 when none)."""
        return self._max(1)

    def max_ready(self) -> int:
        """The most prompts ready on one live process (0 when none)."""
        return self._max(2)

    def _post(self, slot: int, field: int, count: int) -> None:
        """One count of a slot's record, stamped with this process's pid (the other count kept)."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not on a board of {self.num_slots}")
        offset = slot * RECORD.size
        _INT64.pack_into(self._map, offset + _INT64.size * field, count)
        _INT64.pack_into(self._map, offset, os.getpid())

    def _max(self, field: int) -> int:
        most = 0
        for record in RECORD.iter_unpack(self._map):
            if record[0] > 0 and record[field] > most and _alive(record[0]):
                most = record[field]
        return most


class BacklogPoster:
    """One writer's slot: what a node's admission calls on every change of its queue."""

    def __init__(self, board: BacklogBoard, slot: int) -> None:
        self.board, self.slot = board, slot
        board.post(slot, 0)

    def __call__(self, num_waiting: int) -> None:
        self.board.post(self.slot, num_waiting)

    def post_ready(self, num_ready: int) -> None:
        """What a prefill node calls on every change of the prompts in its engine."""
        self.board.post_ready(self.slot, num_ready)


def board_from_env(env: Mapping[str, str] = os.environ) -> BacklogBoard | None:
    path = env.get(BOARD_VAR)
    return BacklogBoard(Path(path)) if path else None


def poster_from_env(env: Mapping[str, str] = os.environ) -> BacklogPoster | None:
    """This process's slot, when a launcher gave it one."""
    board = board_from_env(env) if env.get(SLOT_VAR) else None
    return BacklogPoster(board, int(env[SLOT_VAR])) if board is not None else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and someone else's
        return True
    return True


def board_roles(role_of_process: Mapping[str, str], shares_cores: Mapping[str, bool]) -> dict[str, int | None]:
    """Who is on a launcher's board: process name -> its slot (encoder and prefill nodes, the
    writers) or None (decode nodes, the readers), among the processes sharing cores. Empty when
    no decode node shares cores with a writer: then nobody has anything to yield to."""
    sharing = [name for name, role in role_of_process.items() if shares_cores.get(name)]
    writers = [name for name in sharing if role_of_process[name] in WRITER_ROLES]
    readers = [name for name in sharing if role_of_process[name] == "decode"]
    if not writers or not readers:
        return {}
    return {**{name: slot for slot, name in enumerate(writers)}, **dict.fromkeys(readers)}


def board_env(path: Path, slot: int | None) -> dict[str, str]:
    return {BOARD_VAR: str(path), **({SLOT_VAR: str(slot)} if slot is not None else {})}
