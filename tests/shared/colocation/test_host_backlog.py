"""The host's backlog board: writers' slots, the longest live queue, dead writers skipped, and
who a launcher puts on it (pure logic, on a temporary file and a real child process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.colocation.host_backlog import (
    BOARD_VAR,
    SLOT_VAR,
    BacklogBoard,
    board_env,
    board_roles,
    create_board,
    new_board,
    poster_from_env,
)


def test_a_reader_sees_the_longest_queue_its_writers_posted(tmp_path):
    path = create_board(tmp_path / "board", 3)
    encoder, prefill = poster_from_env(board_env(path, 0)), poster_from_env(board_env(path, 2))
    reader = BacklogBoard(path)
    assert reader.num_slots == 3 and reader.max_waiting() == 0
    encoder(5)
    prefill(2)
    assert reader.max_waiting() == 5
    encoder(0)
    assert reader.max_waiting() == 2


def test_a_dead_writers_count_is_ignored(tmp_path):
    path = create_board(tmp_path / "board", 2)
    post_and_exit = f"from shared.colocation.host_backlog import BacklogBoard; BacklogBoard({str(path)!r}).post(1, 9)"
    subprocess.run([sys.executable, "-c", post_and_exit], check=True)
    assert BacklogBoard(path).max_waiting() == 0  # 9 calls posted by a process that is gone


def test_a_slot_off_the_board_or_a_file_that_is_not_one_is_refused(tmp_path):
    board = BacklogBoard(create_board(tmp_path / "board", 2))
    with pytest.raises(ValueError, match="slot 2"):
        board.post(2, 1)
    (tmp_path / "odd").write_bytes(b"x" * 5)
    with pytest.raises(ValueError, match="not a backlog board"):
        BacklogBoard(tmp_path / "odd")


def test_without_the_launchers_variables_there_is_no_board():
    assert poster_from_env({}) is None
    assert poster_from_env({BOARD_VAR: ""}) is None


def test_readers_get_no_slot(tmp_path):
    path = create_board(tmp_path / "board", 1)
    assert board_env(path, None) == {BOARD_VAR: str(path)}
    assert poster_from_env(board_env(path, None)) is None
    assert board_env(path, 0)[SLOT_VAR] == "0"


def test_encoders_and_prefill_nodes_write_and_decode_nodes_read_among_those_sharing_cores():
    roles = {"preprocess": "preprocess", "encoder": "encoder", "prefill": "prefill", "prefill-1": "prefill", "decode": "decode"}
    everyone = dict.fromkeys(roles, True)
    assert board_roles(roles, everyone) == {"encoder": 0, "prefill": 1, "prefill-1": 2, "decode": None}
    pinned_decode = {**everyone, "decode": False}  # on its own cores: nothing to yield to
    assert board_roles(roles, pinned_decode) == {}
    assert board_roles({"decode": "decode"}, {"decode": True}) == {}


def test_a_new_board_removes_those_whose_maker_is_gone(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True)
    orphan = create_board(tmp_path / f"tessera-backlog-{int(gone.stdout)}-x1", 1)  # its launcher was SIGKILLed
    live = new_board(2, tmp_path)
    other = create_board(tmp_path / "tessera-backlog-notes", 1)  # not named as a board: left alone
    assert live.name.startswith(f"tessera-backlog-{os.getpid()}-") and BacklogBoard(live).num_slots == 2
    assert not orphan.exists() and other.exists()
    assert new_board(1, tmp_path) != live and live.exists()  # a live maker's board stays


def test_prompts_ready_are_posted_and_read_apart_from_calls_waiting(tmp_path):
    path = create_board(tmp_path / "board", 2)
    encoder, prefill = poster_from_env(board_env(path, 0)), poster_from_env(board_env(path, 1))
    reader = BacklogBoard(path)
    prefill(6)  # six calls, most waiting on their encodes ...
    prefill.post_ready(2)  # ... two of them ready to prefill
    encoder(3)
    assert reader.max_waiting() == 6 and reader.max_ready() == 2
    prefill(1)  # posting one count keeps the other
    assert reader.max_waiting() == 3 and reader.max_ready() == 2
