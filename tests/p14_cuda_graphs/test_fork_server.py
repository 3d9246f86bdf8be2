"""p14_cuda_graphs: the processes the fork server makes (workers, the served engine) may use CUDA.

A fork of a process that asked the CUDA driver anything cannot; torch.cuda.is_available() asks it
unless PYTORCH_NVML_BASED_CUDA_CHECK=1 is in the fork server's environment, from its start."""
import importlib
import os

PHASE = "p14_cuda_graphs"
worker_pool = importlib.import_module(f"phases.{PHASE}.worker_pool")


def report_check(queue) -> None:
    queue.put(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))


def test_a_fork_server_child_checks_for_cuda_through_nvml():
    ctx = worker_pool.context()
    queue = ctx.Queue()
    proc = ctx.Process(target=report_check, args=(queue,), daemon=True)
    proc.start()
    try:
        assert queue.get(timeout=120) == "1"
    finally:
        proc.join(10)
