"""common.peer: the peer engine's JSON becomes records that common.report's peer table reads."""
from common import peer, report

RAW = {"offline": {"output_tok_s": [20000.0, 26000.0, 25000.0], "median": 25000.0},
       "concurrency64": {"output_tok_s": [21000.0, 22000.0], "median": 21500.0},
       "latency": {"decode_tok_s": [640.0, 650.0, 645.0], "median": 645.0}}


def test_peer_json_becomes_one_record_per_workload_with_its_spread():
    recs = peer.to_records(RAW, "p14_cuda_graphs", "llama-1b", "NVIDIA H200", "make phase-14 bench PART=nano-vllm")
    by = {r["workload"]: r for r in recs}
    assert set(by) == {"offline", "concurrency", "latency"}
    assert by["concurrency"]["setting"] == {"concurrency": 64}
    assert by["latency"]["metrics"] == {"decode_tok_s": 645.0}
    assert by["offline"]["spread"]["output_tok_s"] == [20000.0, 26000.0]
    assert all(r["engine"] == "nano-vllm" and r["provenance"]["make_command"].endswith("nano-vllm") for r in recs)


def test_peer_table_puts_the_phase_engine_beside_the_peer():
    recs = [r | {"file": "results/p14_cuda_graphs/peer-h200.json"}
            for r in peer.to_records(RAW, "p14_cuda_graphs", "llama-1b", "NVIDIA H200", "make x")]
    ours = {"phase": "p14_cuda_graphs", "engine": "p14", "workload": "latency", "preset": "llama-1b",
            "setting": {"batch": 1}, "device": "NVIDIA H200", "metrics": {"decode_tok_s": 700.0},
            "spread": {"decode_tok_s": [690.0, 705.0]}, "provenance": {"utc": "2026-12-02T11:00:00"},
            "file": "results/p14_cuda_graphs/latency-h200.json"}
    text = report.peer_table(recs + [ours], "p14_cuda_graphs")
    assert "| llama-1b | latency batch=1 | decode tok/s | 700 (690–705) | 645 (640–650) |" in text
    assert "| llama-1b | concurrency concurrency=64 | output tok/s | – | 21,500 (21,000–22,000) |" in text
    assert "peer-h200.json" in text and "latency-h200.json" in text


def test_peer_table_reads_the_standard_runs_and_names_a_smaller_pool():
    """A newer speculation-sweep record of the same workload (common.spec_decode: it counts tokens
    per step) is not the phase's latency; an offline run on a set KV pool says so in its cell."""
    recs = [r | {"file": "results/p14_cuda_graphs/peer-h200.json"}
            for r in peer.to_records(RAW, "p14_cuda_graphs", "llama-8b", "NVIDIA H200", "make x")]
    base = {"phase": "p14_cuda_graphs", "engine": "p14", "preset": "llama-8b", "device": "NVIDIA H200",
            "scale": "full"}
    latency = base | {"workload": "latency", "setting": {"batch": 1}, "metrics": {"decode_tok_s": 192.0},
                      "spread": {"decode_tok_s": [185.0, 194.0]}, "provenance": {"utc": "2026-12-03T04:31:00"},
                      "file": "results/p14_cuda_graphs/latency-h200.json"}
    sweep = base | {"workload": "latency", "setting": {"batch": 1},
                    "metrics": {"decode_tok_s": 196.0, "tokens_per_step": 1.0},
                    "spread": {"decode_tok_s": [195.0, 196.0]}, "provenance": {"utc": "2026-12-03T06:01:00"},
                    "file": "results/p14_cuda_graphs/speed-h200.json"}
    offline = base | {"workload": "offline", "setting": {"kv_cache_bytes": 24 << 30},
                      "metrics": {"output_tok_s": 8952.0}, "spread": {"output_tok_s": [8070.0, 9412.0]},
                      "provenance": {"utc": "2026-12-03T06:05:00"}, "file": "results/p14_cuda_graphs/offline-h200.json"}
    text = report.peer_table(recs + [latency, sweep, offline], "p14_cuda_graphs")
    assert "| llama-8b | latency batch=1 | decode tok/s | 192 (185–194) | 645 (640–650) |" in text
    assert "| llama-8b | offline | output tok/s | 8,952 (8,070–9,412) (KV pool 24 GiB) | 25,000 (20,000–26,000) |" in text
    assert "speed-h200.json" not in text


def test_no_peer_run_says_how_to_make_one():
    assert "PART=nano-vllm" in report.peer_table([], "p14_cuda_graphs")
