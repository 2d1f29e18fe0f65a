"""The progress line's figures (photon/progress_line.py): bytes left, the rate bytes were finished at, the ETA."""

from photon.progress_line import StreamProgress, megabytes


def test_eta_from_the_bytes_finished_since_the_start():
    stream = StreamProgress(started_at=100.0, finished_at_start=1_000_000, left=30_000_000, finished=11_000_000)
    assert stream.rate(now=110.0) == 1_000_000  # 10 MB in 10 s
    assert stream.eta(now=110.0) == "ETA 0:00:30"
    assert StreamProgress(started_at=100.0, finished_at_start=0, left=7_200_000_000, finished=1_000_000).eta(101.0) \
        == "ETA 2:00:00"
    assert StreamProgress(started_at=100.0, finished_at_start=5, left=10, finished=5).eta(200.0) == "ETA ?"  # none yet
    assert StreamProgress(started_at=100.0, left=0).eta(200.0) == "done"
    assert megabytes(3_149_999) == "3.1 MB"
