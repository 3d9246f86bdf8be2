"""KVConnector: how one request's K/V goes from the prefill instance (P) to the decode instance (D).

P gathers a request's blocks into one tensor, (num_layers, 2, n, block_size, num_kv_heads, head_dim)
(MLA: (num_layers, 1, n, block_size, 1, latent + rotary key): latents move as latents), and hands
it to send(), which returns a small picklable `meta` that rides on P's "first token" message. D
reserves n blocks, then recv(meta, cache, blocks) starts the K/V's way into them and returns a
Transfer. One batched transfer a request: one message, whatever the number of layers and blocks.

  SendRecvConnector  torch.distributed isend/irecv: NCCL between two GPUs, gloo on CPU. D receives
                     into a buffer of its own, then copies it into its blocks on its compute stream.
  IpcConnector       P and D on one GPU (NCCL refuses two ranks on one device): meta is a CUDA IPC
                     handle of P's gathered tensor; D maps it and copies it into its blocks on a
                     side stream.
D acknowledges each request's K/V once landed (or discarded), and P drops its tensor then.

Transfers of one connector complete in the order they were started (a point-to-point channel is
ordered), so D starts them in P's order and lands them in that order.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

DECODE_RANK, PREFILL_RANK = 0, 1      # D drives (the process the user talks to); P is the one it starts


class Transfer:
    """One request's K/V on its way into D's blocks."""

    def ready(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout_s: float) -> None:
        """Block until ready(); raise when the peer fails or timeout_s passes."""
        raise NotImplementedError

    def land(self) -> None:
        """After ready(): the K/V is in D's blocks for the next step on D's compute stream to read."""
        raise NotImplementedError


class KVConnector:
    held: dict[int, object]                            # P: seq_id -> what it keeps until D acknowledges

    def send(self, seq_id: int, kv: torch.Tensor):
        """P: start moving kv (kept alive until it is gone); return the meta D's recv() needs."""
        raise NotImplementedError

    def recv(self, seq_id: int, meta, cache, block_ids: list[int]) -> Transfer:
        """D: start moving the request's K/V into these blocks of cache (as many as P sent)."""
        raise NotImplementedError

    def discard(self, seq_id: int, meta) -> None:
        """D: a request aborted after P sent it: consume its K/V (a channel stays in order)."""
        raise NotImplementedError

    def release(self, seq_id: int) -> None:
        """P: D acknowledged the request's K/V (landed or discarded): drop P's tensor."""
        raise NotImplementedError


class _Received(Transfer):
    def __init__(self, work, buffer: torch.Tensor, cache, block_ids: list[int]):
        self.work, self.buffer, self.cache, self.block_ids = work, buffer, cache, block_ids
        self.waited = False                            # a work is waited for once (gloo's hangs twice)

    def ready(self) -> bool:
        # gloo's point-to-point work reports completion only once waited for: on CPU the answer is
        # yes, and land() waits (the bytes are on their way: P started the send before its message)
        return self.waited or not self.buffer.is_cuda or self.work.is_completed()

    def wait(self, timeout_s: float) -> None:
        if not self.waited and not self.work.wait(timedelta(seconds=timeout_s)):
            raise TimeoutError(f"a KV transfer did not complete within {timeout_s:g} s")
        self.waited = True

    def land(self) -> None:
        self.wait(0)                                   # NCCL: the compute stream waits for the receive
        self.cache.restore(self.block_ids, self.buffer)   # (n blocks, every layer) -> D's blocks


class SendRecvConnector(KVConnector):
    """torch.distributed point-to-point on the engine pair's process group."""

    def __init__(self, rank: int, device: str, dtype: torch.dtype):
        self.rank, self.device, self.dtype = rank, device, dtype
        self.held: dict[int, tuple] = {}               # seq_id -> (work, kv)
        warm = torch.zeros(1, device=device)           # the pair's first exchange sets up the channel
        (dist.send if rank == PREFILL_RANK else dist.recv)(warm, DECODE_RANK + PREFILL_RANK - rank)

    def send(self, seq_id: int, kv: torch.Tensor):
        self.held[seq_id] = (dist.isend(kv, dst=DECODE_RANK), kv)
        return tuple(kv.shape)

    def recv(self, seq_id: int, meta, cache, block_ids: list[int]) -> Transfer:
        buffer = torch.empty(meta, dtype=cache.layers[0].dtype, device=cache.layers[0].device)
        return _Received(dist.irecv(buffer, src=PREFILL_RANK), buffer, cache, block_ids)

    def discard(self, seq_id: int, meta) -> None:
        dist.recv(torch.empty(meta, dtype=self.dtype, device=self.device), src=PREFILL_RANK)

    def release(self, seq_id: int) -> None:
        work, _ = self.held.pop(seq_id)
        work.wait()                                    # done (D has it): gloo's work completes so


class _Mapped(Transfer):
    def __init__(self, event, kv: torch.Tensor):
        self.event, self.kv = event, kv                # the mapping stays open until the copy is done

    def ready(self) -> bool:
        return self.event.query()

    def wait(self, timeout_s: float) -> None:
        self.event.synchronize()

    def land(self) -> None:
        torch.cuda.current_stream().wait_event(self.event)   # the next step reads the blocks after the copy
        self.event.synchronize()
        self.kv = None                                 # then the mapping may close


class IpcConnector(KVConnector):
    """P and D on one GPU: D reads P's gathered tensor through a CUDA IPC mapping."""

    def __init__(self, rank: int, device: str):
        self.held: dict[int, torch.Tensor] = {}        # P: seq_id -> the tensor D maps
        self.stream = torch.cuda.Stream(device) if rank == DECODE_RANK else None

    def send(self, seq_id: int, kv: torch.Tensor):
        from torch.multiprocessing.reductions import reduce_tensor
        self.held[seq_id] = kv
        return reduce_tensor(kv)                       # (rebuild function, its args): picklable

    def recv(self, seq_id: int, meta, cache, block_ids: list[int]) -> Transfer:
        rebuild, args = meta
        # The side stream first waits for D's compute stream: a block freed a step ago may still
        # be written by that step's kernels.
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            kv = rebuild(*args)                        # waits (on this stream) for P's gather
            cache.restore(block_ids, kv)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Mapped(event, kv)

    def discard(self, seq_id: int, meta) -> None:
        pass                                           # nothing to consume: P drops it on the ack

    def release(self, seq_id: int) -> None:
        self.held.pop(seq_id)


def make_connector(rank: int, decode_device: str, prefill_device: str, dtype: torch.dtype) -> KVConnector:
    """By placement: one GPU for both -> CUDA IPC; else send/recv (NCCL across GPUs, gloo on CPU)."""
    device = decode_device if rank == DECODE_RANK else prefill_device
    if same_gpu(decode_device, prefill_device):
        return IpcConnector(rank, device)
    return SendRecvConnector(rank, device, dtype)


def same_gpu(a: str, b: str) -> bool:
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type == "cuda" and (a.index or 0) == (b.index or 0)


def backend_for(decode_device: str, prefill_device: str) -> str:
    """The pair's process group: NCCL between two GPUs; gloo otherwise (CPU; one GPU, where the
    group only starts the pair and IPC moves the K/V)."""
    both_cuda = decode_device.startswith("cuda") and prefill_device.startswith("cuda")
    return "nccl" if both_cuda and not same_gpu(decode_device, prefill_device) else "gloo"
