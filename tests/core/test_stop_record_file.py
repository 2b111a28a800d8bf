"""trainhub.settings.StopRecordFile: a reader that asks on every pass sees each new stop record, read once."""

from __future__ import annotations

from trainhub.settings import DataDir, StopRecord, StopRecordFile


def test_each_new_record_is_seen_and_an_unchanged_file_is_not_read_again(tmp_path, monkeypatch):
    dd = DataDir(tmp_path)
    watched = StopRecordFile(str(tmp_path))
    assert watched.read() is None  # none written yet

    StopRecord("run-1", 100.0).save(dd)
    first = watched.read()
    assert first == StopRecord("run-1", 100.0)

    loads = []
    real_load = StopRecord.load
    monkeypatch.setattr(StopRecord, "load", classmethod(lambda cls, d: loads.append(d) or real_load(d)))
    assert watched.read() is first and loads == []  # unchanged: the kept record, no read

    StopRecord("run-2", 200.0, reason="did not stop cleanly").save(dd)  # a new file in its place
    assert watched.read() == StopRecord("run-2", 200.0, reason="did not stop cleanly") and len(loads) == 1

    dd.stop_record.unlink()
    assert watched.read() is None
