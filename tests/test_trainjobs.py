"""Training jobs of the quality benchmarks: a job's process never outlives the benchmark."""

import os
import subprocess
import sys
import textwrap

from swarm_helpers import wait_for

BENCHMARK = textwrap.dedent("""
    import functools, multiprocessing as mp, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from swarm.lab.trainjobs import _start_job_process

    def job(marker):
        Path(marker).write_text("training")
        time.sleep(60)

    if __name__ == "__main__":
        pool = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                   initializer=functools.partial(_start_job_process, None))
        marker = Path(sys.argv[1] + ".running")
        pool.submit(job, str(marker))
        while not marker.exists():  # the job is busy, as a training job is
            time.sleep(0.1)
        Path(sys.argv[1]).write_text(" ".join(str(p.pid) for p in pool._processes.values()))
        os._exit(0)  # killed, as by a signal: no clean-up runs
""")



def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"  # a zombie has already died


def test_a_job_dies_with_the_benchmark_that_started_it(tmp_path):
    script = tmp_path / "benchmark.py"
    script.write_text(BENCHMARK)
    pid_file = tmp_path / "job.pid"
    # no pipes: the job must not keep this test waiting on an output it inherited
    done = subprocess.run([sys.executable, str(script), str(pid_file)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip
    assert done.returncode == 0
    (job,) = map(int, pid_file.read_text().split())
    wait_for(lambda: not alive(job), 10, "the job to die with its benchmark")  # it would sleep 60 s on
