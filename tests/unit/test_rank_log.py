"""A process's output on its way to the log and back (shared/rank_log.py): bounded, newest kept, gaps marked."""

from __future__ import annotations

from shared.names import LOG_CHUNK_BYTES
from shared.rank_log import LINE_MAX_BYTES, LogReader, Pending, as_text, render, split_line
from shared.schemas import LogChunk


def take_all(p: Pending, rank: int = 0) -> list[LogChunk]:
    out = []
    while p:
        out.append(p.take("j", 1, rank, "n0", 0.0))
    return out


def test_a_line_is_text_with_its_newline_and_a_long_one_is_cut() -> None:
    assert split_line(b"hello") == ["hello\n"] and split_line(b"hello\n") == ["hello\n"] and split_line(b"") == ["\n"]
    assert split_line(b"\xffbad") == ["\ufffdbad\n"]
    long = split_line(b"x" * (2 * LINE_MAX_BYTES + 5))
    assert [len(p) for p in long] == [LINE_MAX_BYTES + 1, LINE_MAX_BYTES + 1, 6]


def test_chunks_carry_whole_lines_in_order_up_to_the_chunk_size() -> None:
    p = Pending()
    lines = [f"line {i:05d} " + "y" * 90 + "\n" for i in range(500)]
    for line in lines:
        p.add(line)
    chunks = take_all(p)
    assert all(len(c.text) <= LOG_CHUNK_BYTES for c in chunks) and len(chunks) > 1
    assert "".join(c.text for c in chunks) == "".join(lines)
    assert [c.n for c in chunks] == list(range(len(chunks)))
    assert [c.first_line for c in chunks] == [sum(c.text.count("\n") for c in chunks[:i]) for i in range(len(chunks))]
    assert render(chunks, prefix=False) == lines


def test_a_process_writing_faster_than_its_log_ships_loses_its_oldest_lines_marked() -> None:
    p = Pending(limit=1000)
    for i in range(100):
        p.add(f"{i:02d}" + "." * 47 + "\n")  # 50 bytes: 20 fit
    assert p.size <= 1000 and p.dropped == 80
    chunks = take_all(p)
    assert chunks[0].dropped == 80 and chunks[0].first_line == 80
    text = render(chunks, prefix=False)
    assert text[0] == "[rackscale: 80 lines dropped: the process wrote faster than its log shipped]\n"
    assert text[1].startswith("80") and text[-1].startswith("99")  # the newest kept
    p.add("later\n")  # a drop is told once
    (again,) = take_all(p)
    assert again.dropped == 0 and again.first_line == 100 and render([*chunks, again], prefix=False)[-1] == "later\n"


def test_chunks_the_log_let_go_are_marked_and_ranks_keep_their_own_count() -> None:
    p0, p1 = Pending(), Pending()
    stream: list[LogChunk] = []  # two ranks' chunks interleaved, as they shipped
    for i in range(3):
        p0.add(f"a{i}\n")
        stream.append(p0.take("j", 1, 0, "n0", 0.0))
        p1.add(f"b{i}\n")
        stream.append(p1.take("j", 1, 1, "n1", 0.0))
    assert render(stream, prefix=True) == ["0: a0\n", "1: b0\n", "0: a1\n", "1: b1\n", "0: a2\n", "1: b2\n"]
    kept = [c for c in stream if not (c.rank == 1 and c.n == 0)]  # the cap let rank 1's first chunk go
    assert render(kept, prefix=True)[2:4] == [
        "1: [rackscale: 1 line dropped: the oldest, past the log's size cap]\n",
        "1: b1\n",
    ]
    reader = LogReader()  # a follower adds chunks as they come and keeps count between them
    assert [[line.text for line in reader.add(c)] for c in stream if c.rank == 0] == [["a0"], ["a1"], ["a2"]]
    resumed = LogReader(resumed=True)  # ... and one reconnecting after rank 1's first chunk sees no gap
    assert [line.text for c in kept if c.rank == 1 for line in resumed.add(c)] == ["b1", "b2"]


def test_a_carriage_return_stays_inside_its_line_and_markers_are_typed() -> None:
    p = Pending(limit=8)
    for line in ("one\n", "two\n", "3\r33\n"):
        p.add(line)
    lines = LogReader().add(p.take("j", 1, 0, "n0", 0.0))
    assert [(line.dropped, line.text) for line in lines] == [
        (2, "[rackscale: 2 lines dropped: the process wrote faster than its log shipped]"),
        (0, "3\r33"),
    ]
    assert as_text(lines[1], prefix=True) == "0: 3\r33\n"
