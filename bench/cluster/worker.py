"""One JAX process of the cluster benchmark (started by cluster.py, one per
network namespace or all on loopback).

It joins the cluster (``jax.distributed.initialize``, gloo TCP collectives
bound to this process's own address), compiles every program of the run
once, then for each link rate: shapes its own link (if asked), and times
each program: warm-up runs, then timed runs, each after a barrier of the
coordination service (gRPC, not gloo: it compiles nothing and equarx never
sees it). Around the timed runs it reads the ``tc -s`` byte counter of its
link. It writes one JSON file; cluster.py aggregates the ranks.

Programs (all inside ``shard_map`` over one mesh axis of P devices, one per
process):

- ``psum``       ``lax.psum`` of the bf16 payload, as is. XLA:CPU promotes a
                 bf16 all-reduce to f32: 4 bytes per element on the wire.
- ``psum-f16``   the payload converted to f16 and summed with ``psum``: 2
                 bytes per element, summed in software by gloo.
- ``ring-u16``   a 2-byte baseline: reduce-scatter ring of P-1
                 collective-permutes of bf16 chunks bit-cast to u16 (XLA:CPU
                 would promote a bf16 collective-permute to f32), summed in
                 f32 and rounded to bf16 at every hop, then an all-gather of
                 u16 — what a bf16 ring all-reduce sends.
- ``twoshot-u16`` the same bytes as equarx's two-shot: one all-to-all of
                 the P chunks as u16, each rank's chunk summed in f32 and
                 rounded to bf16, then an all-gather of u16.
- ``ring-u8``, ``twoshot-u8``  bounds, not methods: the two above with one
                 byte a element on the wire, the bf16's high byte (a shift
                 each way, so values come back as powers of four). What a
                 free 1-byte codec would buy on this wire and host: the
                 ceiling of any int8 rewrite of the same exchange.
- ``equarx:CFG`` the ``psum`` program compiled with equarx enabled through
                 the JAX door (``equarx.jax.enable``).

The other collectives have baselines of their own (``BASELINES``), and
their equarx variants compile the workload's plain program (the first
baseline, also the unquantized reference):

- reducescatter: ``psum-scatter`` (``lax.psum_scatter``, tiled, as is) and
  ``ring-u16`` (the reduce-scatter half of the ring above: P-1
  collective-permutes of u16 bits, summed in f32, rounded to bf16 per hop).
- allgather: ``all-gather`` (``lax.all_gather`` of bf16, tiled, as is) and
  ``all-gather-u16`` (the same of the bf16 bit-cast to u16).

The ``gemma`` workload is the real model of bench/model (Gemma 3 270M,
its dequantized Q4_K_M weights) prefilling Lee-corpus tokens, Megatron
tensor-parallel over the processes, with the all-reduce baselines above as
its 36 reductions (``gemma_workload``).

The wire types of every compiled program are read from its optimized HLO.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import traceback

import trace_summary

MIB = 1 << 20

#: The all-reduce workloads' baselines: the program as written, three
#: 2-byte ones, and two 1-byte bounds.
ALL_REDUCE_BASELINES = ("psum", "psum-f16", "ring-u16", "twoshot-u16", "ring-u8", "twoshot-u8")

#: Each workload's baselines; the first is the program as written, which
#: equarx variants compile and whose output is the unquantized reference.
BASELINES = {
    "allreduce": ALL_REDUCE_BASELINES,
    "reducescatter": ("psum-scatter", "ring-u16"),
    "allgather": ("all-gather", "all-gather-u16"),
    "prefill": ALL_REDUCE_BASELINES,
    "gemma": ALL_REDUCE_BASELINES,
}

#: The gemma workload's shape: batch (windows of the Lee corpus) x seq
#: (tokens each, BOS first), skip (windows' worth of text left out first).
GEMMA_DEFAULT = "batch=4,seq=512,skip=0"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--coordinator", required=True, help="host:port of process 0")
    p.add_argument("--address", required=True, help="this process's address (gloo binds to it)")
    p.add_argument("--out", required=True, help="JSON result file")
    p.add_argument("--workloads", default="allreduce")
    p.add_argument("--sizes", default="1,4,16,64", help="collective payloads, MiB of bf16 (4k: KiB)")
    p.add_argument("--baselines", default=",".join(dict.fromkeys(sum(BASELINES.values(), ()))),
                   help="each workload runs those of its own (BASELINES)")
    p.add_argument("--configs", default="b64-d2", help="equarx configurations for the all-reduce "
                   "workload (see config_options)")
    p.add_argument("--reducescatter-configs", default="auto", help="for the reduce-scatter workload")
    p.add_argument("--allgather-configs", default="auto", help="for the all-gather workload")
    p.add_argument("--prefill-configs", default="b64-d2", help="equarx configurations for prefill")
    p.add_argument("--gemma-configs", default="auto", help="equarx configurations for gemma")
    p.add_argument("--rates", default="", help="link rates, one phase each ('' = leave the link as is)")
    p.add_argument("--iface", default="", help="this process's link, for tc counters ('' = none)")
    p.add_argument("--switch-netns", default="", help="namespace of the bridge (for shaping ingress)")
    p.add_argument("--switch-port", default="", help="this process's port on the bridge")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--prefill", default="layers=4,batch=16,seq=256,width=256,heads=8,mlp=1024")
    p.add_argument("--gemma", default=GEMMA_DEFAULT, help="Gemma 3 270M prefill: batch (windows) "
                   "x seq (tokens each, BOS first) of the Lee corpus, skip (windows of text)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--barrier-timeout", type=float, default=300.0, help="seconds")
    p.add_argument("--dump-hlo", default="", help="directory for optimized HLO text (rank 0)")
    p.add_argument("--profile", default="", help="directory: one more run of each program under "
                   "the JAX profiler, summarized (trace_summary.py)")
    return p.parse_args(argv)


# ---------------------------------------------------------------- equarx configurations

def config_options(name: str) -> dict:
    """``b64-d2`` → equarx.jax.enable options. Tokens (any order, '-'
    separated): ``bN`` block size, ``dN`` pipeline depth, ``bidi``
    bidirectional ring, ``f32s``/``bf16s`` scale type, ``permute`` gather by
    P-1 collective-permutes instead of all-gather, ``ring``/``twoshot``/
    ``twolevel`` the algorithm, ``had``/``norot`` Hadamard rotation or none,
    ``unroll`` the unrolled form instead of the loop, ``int8``/``int4``/
    ``fp8e4m3``/``fp8e5m2`` the code format (``quant_format``). Without
    tokens for them: the paper's ring, unrotated, one way round, two lanes,
    the loop, int8 codes. ``auto``
    first drops those to the pass's own defaults (the time model chooses
    the algorithm and the rotation; one lane each way round). No error
    budget (``max_error``) is set, so the pass never skips an op for its
    predicted error: int4 rewrites whatever its error."""
    opts = {"platforms": ("cpu",), "types": ("bf16", "f32"), "min_payload": 0,
            "block_size": 64, "pipeline_depth": 2, "bidirectional": False,
            "scale_type": "bf16", "gather": "all-gather", "algorithm": "ring",
            "rotation": "none", "unroll": False, "quant_format": "int8"}
    for tok in name.split("-"):
        if not tok:
            continue
        if tok == "auto":
            for k in ("pipeline_depth", "bidirectional", "algorithm", "rotation"):
                opts.pop(k, None)
        elif re.fullmatch(r"b\d+", tok):
            opts["block_size"] = int(tok[1:])
        elif re.fullmatch(r"d\d+", tok):
            opts["pipeline_depth"] = int(tok[1:])
        elif tok == "bidi":
            opts["bidirectional"] = True
        elif tok in ("f32s", "bf16s"):
            opts["scale_type"] = tok[:-1]
        elif tok == "permute":
            opts["gather"] = "permute"
        elif tok in ("pre", "exact"):
            pass  # compile_before_fusion, not the JAX door; exact: no excess precision
        elif tok == "allgather":
            opts["gather"] = "all-gather"
        elif tok in ("ring", "twoshot", "twolevel"):
            opts["algorithm"] = {"ring": "ring", "twoshot": "two-shot", "twolevel": "two-level"}[tok]
        elif tok in ("had", "norot"):
            opts["rotation"] = "hadamard" if tok == "had" else "none"
        elif tok == "unroll":
            opts["unroll"] = True
        elif tok in ("int8", "int4", "fp8e4m3", "fp8e5m2"):
            opts["quant_format"] = {"fp8e4m3": "fp8-e4m3", "fp8e5m2": "fp8-e5m2"}.get(tok, tok)
        else:
            raise SystemExit(f"unknown equarx config token {tok!r} in {name!r}")
    return opts


# ---------------------------------------------------------------- links

def tc_bytes(iface: str) -> int | None:
    """Bytes the root qdisc of ``iface`` (in this namespace) has sent."""
    if not iface:
        return None
    out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", iface],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    roots = [q for q in json.loads(out) if q.get("root")]
    return int(roots[0]["bytes"]) if roots else None


def shape_cmds(rate: str, iface: str, switch_netns: str, switch_port: str) -> list[list[str]]:
    """tbf on both directions of one process's link: its own egress and its
    bridge port's egress (= its ingress)."""
    tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
    cmds = [["tc", "qdisc", "replace", "dev", iface] + tbf]
    if switch_netns and switch_port:
        cmds.append(["tc", "-n", switch_netns, "qdisc", "replace", "dev", switch_port] + tbf)
    return cmds


# ---------------------------------------------------------------- HLO inspection

COLLECTIVE = re.compile(
    r"=\s*\(?\s*([a-z][a-z0-9]*)\[[^\]]*\][^=]*?\b(all-reduce|all-reduce-start|collective-permute|"
    r"collective-permute-start|all-gather|all-gather-start|reduce-scatter|all-to-all)\(")


def wire_types(hlo_text: str) -> dict[str, int]:
    """Collectives of an optimized module by op and element type, e.g.
    ``{"all-reduce f32": 1}``."""
    counts: dict[str, int] = {}
    for line in hlo_text.splitlines():
        m = COLLECTIVE.search(line)
        if m:
            key = f"{m.group(2).replace('-start', '')} {m.group(1)}"
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---------------------------------------------------------------- programs

def build(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    nproc = jax.process_count()
    rank = jax.process_index()
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    assert len(devices) == nproc, f"want one device per process, got {devices}"
    mesh = Mesh(np.array(devices), ("x",))
    local = jax.local_devices()[0]

    def global_array(local_np, spec_rows):
        """A global array whose rows ``[rank*n:(rank+1)*n]`` are this
        process's ``local_np`` (sharded along the first axis)."""
        shape = (local_np.shape[0] * nproc,) + local_np.shape[1:]
        buf = jax.device_put(local_np, local)
        return jax.make_array_from_single_device_arrays(
            shape, NamedSharding(mesh, spec_rows), [buf])

    # ---- all-reduce implementations (inside shard_map over mesh axis
    # ``axis``: "x" here, the model harness's "tp" for the gemma workload)
    def ar_psum(v, axis="x"):
        return lax.psum(v, axis)

    def ar_psum_f16(v, axis="x"):
        return lax.psum(v.astype(jnp.float16), axis).astype(v.dtype)

    # The baselines' wire codecs: bf16 → what a collective carries → bf16.
    # ``u16`` is the bf16's own bits (XLA:CPU would promote a bf16
    # collective to f32); ``u8`` is its high byte (sign and 7 exponent
    # bits), a codec that costs a shift: values come back as powers of
    # four, so ``*-u8`` rows are bounds on what one byte a element buys
    # on this wire and host, not methods (their error columns say so).
    codecs = {
        "u16": (lambda x: lax.bitcast_convert_type(x, jnp.uint16),
                lambda w: lax.bitcast_convert_type(w, jnp.bfloat16)),
        "u8": (lambda x: (lax.bitcast_convert_type(x, jnp.uint16) >> 8).astype(jnp.uint8),
               lambda w: lax.bitcast_convert_type(w.astype(jnp.uint16) << 8, jnp.bfloat16)),
    }

    def chunked(v):
        """v flattened, padded to P equal chunks: ``[P, c]``."""
        flat = v.reshape(-1)
        n = flat.shape[0]
        c = -(-n // nproc)
        return jnp.pad(flat, (0, c * nproc - n)).reshape(nproc, c)

    def ring_reduce_scatter(v, axis="x", codec="u16"):
        """bf16 ring reduce-scatter with the codec's bytes on the wire:
        P-1 collective-permutes, each hop summed in f32 and rounded to
        bf16. Rank r ends with the sum of chunk r (padded to P equal
        chunks), as a tiled ``psum_scatter`` does."""
        encode, decode = codecs[codec]
        chunks = chunked(v)
        r = lax.axis_index(axis)
        succ = [(i, (i + 1) % nproc) for i in range(nproc)]

        def chunk(k):
            return lax.dynamic_index_in_dim(chunks, k % nproc, keepdims=False)

        part = chunk(r - 1).astype(jnp.bfloat16)
        for s in range(nproc - 1):
            got = decode(lax.ppermute(encode(part), axis, succ))
            part = (got.astype(jnp.float32) + chunk(r - 2 - s).astype(jnp.float32)).astype(jnp.bfloat16)
        return part

    def two_shot_reduce_scatter(v, axis="x", codec="u16"):
        """bf16 two-shot reduce-scatter with the codec's bytes on the wire:
        one all-to-all of the P chunks, the P parts of chunk r summed in f32
        (in rank order) and rounded to bf16 by rank r. The exchange
        equarx's two-shot makes, with the cheapest codec."""
        encode, decode = codecs[codec]
        got = decode(lax.all_to_all(encode(chunked(v).astype(jnp.bfloat16)), axis, 0, 0, tiled=True))
        # Added row by row, elementwise: XLA:CPU makes a reduce over the
        # major dimension a YNNPACK kernel, which took the whole op from
        # 12–14 ms to 94 ms (4 MiB, 4 processes on loopback).
        total = got[0].astype(jnp.float32)
        for k in range(1, nproc):
            total = total + got[k].astype(jnp.float32)
        return total.astype(jnp.bfloat16)

    def all_reduce_by(reduce_scatter, codec):
        """An all-reduce: ``reduce_scatter``, then an all-gather of the
        owned chunk, the codec's bytes on the wire both ways."""
        encode, decode = codecs[codec]

        def all_reduce(v, axis="x"):
            owned = encode(reduce_scatter(v, axis, codec))
            full = decode(lax.all_gather(owned, axis, tiled=True))
            return full[:v.size].reshape(v.shape).astype(v.dtype)
        return all_reduce

    def rs_psum_scatter(v):
        return lax.psum_scatter(v, "x", scatter_dimension=0, tiled=True)

    def rs_ring_u16(v):
        assert v.shape[0] % nproc == 0, "the payload must divide into P chunks"
        return ring_reduce_scatter(v).astype(v.dtype)

    def ag_all_gather(v):
        return lax.all_gather(v, "x", tiled=True)

    def ag_all_gather_u16(v):
        wire = lax.bitcast_convert_type(v, jnp.uint16)
        return lax.bitcast_convert_type(lax.all_gather(wire, "x", tiled=True), v.dtype)

    allreduce_impls = {"psum": ar_psum, "psum-f16": ar_psum_f16,
                       "ring-u16": all_reduce_by(ring_reduce_scatter, "u16"),
                       "twoshot-u16": all_reduce_by(two_shot_reduce_scatter, "u16"),
                       "ring-u8": all_reduce_by(ring_reduce_scatter, "u8"),
                       "twoshot-u8": all_reduce_by(two_shot_reduce_scatter, "u8")}
    impls = {"allreduce": allreduce_impls, "prefill": allreduce_impls, "gemma": allreduce_impls,
             "reducescatter": {"psum-scatter": rs_psum_scatter, "ring-u16": rs_ring_u16},
             "allgather": {"all-gather": ag_all_gather, "all-gather-u16": ag_all_gather_u16}}
    assert all(tuple(impls[w]) == BASELINES[w] for w in BASELINES)

    def make_sharded(impl):
        return jax.jit(jax.shard_map(impl, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

    def bf16_inputs(r, n):
        """Rank r's Gaussian bf16 payload (every rank can make any rank's)."""
        g = np.random.default_rng(args.seed * 1000 + r)
        return g.standard_normal(n, dtype=np.float32).astype(jnp.bfloat16)

    workloads = []

    # ---- (a) one collective of S MiB of bf16: an all-reduce and a
    # reduce-scatter of S MiB per rank; an all-gather of S MiB in total
    # (S/P per rank). ``exact`` is what rank 0 should hold, in f64.
    for wname in ("allreduce", "reducescatter", "allgather"):
        if wname not in args.workloads.split(","):
            continue
        for size in [s for s in args.sizes.split(",") if s]:
            kib = size.lower().endswith("k")
            mib = float(size[:-1]) / 1024 if kib else float(size)
            n = int(mib * MIB) // 2
            n -= n % (nproc * nproc)  # P chunks, each of P rows, for the gather too
            n_local = n // nproc if wname == "allgather" else n
            x = global_array(bf16_inputs(rank, n_local), P("x"))
            label = f"{size[:-1]} KiB" if kib else f"{mib:g} MiB"

            def exact(wname=wname, n_local=n_local):
                parts = [bf16_inputs(rr, n_local).astype(np.float64) for rr in range(nproc)]
                if wname == "allgather":
                    return np.concatenate(parts)
                tot = np.sum(parts, axis=0)
                return tot[: n_local // nproc] if wname == "reducescatter" else tot

            workloads.append({"workload": wname, "size": label, "bytes": n * 2,
                              "make": make_sharded, "args": (x,), "exact": exact})

    # ---- (b) Megatron-style tensor-parallel prefill
    if "prefill" in args.workloads.split(","):
        cfg = dict(kv.split("=") for kv in args.prefill.split(","))
        L, B, S, D, H, F = (int(cfg[k]) for k in ("layers", "batch", "seq", "width", "heads", "mlp"))
        assert H % nproc == 0 and F % nproc == 0, "heads and mlp must divide by the process count"
        hd, hl, fl = D // H, H // nproc, F // nproc
        rng = np.random.default_rng(args.seed * 1000 + 500 + rank)  # this rank's weight shards
        bf = jnp.bfloat16

        def w(shape, fan_in):
            return (rng.standard_normal(shape, dtype=np.float32) * fan_in ** -0.5).astype(bf)

        params_local = [{
            "wqkv": w((1, D, 3, hl, hd), D), "wo": w((1, hl, hd, D), D),
            "w1": w((1, D, fl), D), "w2": w((1, fl, D), F),
        } for _ in range(L)]
        params = jax.tree.map(lambda a: global_array(a, P("x")), params_local)
        xrng = np.random.default_rng(args.seed * 1000 + 999)  # the same on every rank
        x_in = xrng.standard_normal((B, S, D), dtype=np.float32).astype(bf)
        x_in = jax.device_put(x_in, NamedSharding(mesh, P()))
        mask = np.tril(np.ones((S, S), bool))

        def layer_norm(v):
            v32 = v.astype(jnp.float32)
            m = v32.mean(-1, keepdims=True)
            var = ((v32 - m) ** 2).mean(-1, keepdims=True)
            return ((v32 - m) * lax.rsqrt(var + 1e-5)).astype(v.dtype)

        def prefill(allreduce):
            def step(ps, v):
                for p in ps:
                    h = layer_norm(v)
                    qkv = jnp.einsum("bsd,dthk->tbhsk", h, p["wqkv"][0])
                    logits = jnp.einsum("bhsk,bhtk->bhst", qkv[0], qkv[1]) * np.float32(hd ** -0.5).astype(bf)
                    logits = jnp.where(mask, logits.astype(jnp.float32), -1e30)
                    attn = jax.nn.softmax(logits, axis=-1).astype(bf)
                    ctx = jnp.einsum("bhst,bhtk->bhsk", attn, qkv[2])
                    v = v + allreduce(jnp.einsum("bhsk,hkd->bsd", ctx, p["wo"][0]))
                    h = layer_norm(v)
                    up = jax.nn.gelu(h @ p["w1"][0])
                    v = v + allreduce(up @ p["w2"][0])
                return v
            return step

        def make(impl):
            return jax.jit(jax.shard_map(prefill(impl), mesh=mesh,
                                         in_specs=(P("x"), P()), out_specs=P(), check_vma=False))

        workloads.append({"workload": "prefill",
                          "size": f"L{L} b{B} s{S} d{D} f{F}",
                          "bytes": 2 * L * B * S * D * 2, "make": make,
                          "args": (params, x_in), "exact": None})

    # ---- (c) Gemma 3 270M prefill, Megatron TP over the processes (T = P)
    if "gemma" in args.workloads.split(","):
        workloads.append(gemma_workload(args, devices, local))

    for wl in workloads:
        wl["impls"] = impls[wl["workload"]]
        wl["plain"] = BASELINES[wl["workload"]][0]
    return np, workloads


def gemma_options(text: str) -> dict:
    """``batch=4,seq=512,skip=0`` → ints: windows of the Lee corpus
    (``seq`` tokens each, BOS first), the first ``skip`` windows' worth of
    text skipped."""
    opts = {k: int(v) for k, v in (kv.split("=") for kv in GEMMA_DEFAULT.split(","))}
    for kv in (t for t in text.split(",") if t):
        k, _, v = kv.partition("=")
        if k not in opts or not v.isdigit():
            raise SystemExit(f"--gemma wants {GEMMA_DEFAULT!r}-style NAME=INT items, got {kv!r}")
        opts[k] = int(v)
    return opts


def gemma_workload(args, devices, local) -> dict:
    """The real model: Gemma 3 270M (bench/model: the dequantized Q4_K_M
    weights, memory-mapped from target/model-cache) prefilling B windows
    of S Lee-corpus tokens, Megatron tensor-parallel over the P processes
    (T = P; q, gate, up column-parallel, o, down row-parallel: 36
    all-reduces of B x S x 640 bf16), params and activations in bf16 as
    the model harness runs them. Each process places only its own shard of
    every TP-sharded parameter; the replicated ones and the tokens are the
    same on every rank. The output is the final hidden states [B, S, 640],
    replicated; ``exact`` is the f32 forward on one device (rank 0's own,
    from the same tokens)."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
    from equarx_model import artifacts, evaluate, gemma, tokenizer, weights

    nproc, rank = jax.process_count(), jax.process_index()
    opts = gemma_options(args.gemma)
    B, S = opts["batch"], opts["seq"]
    cfg, w, _ = weights.load()  # memory-mapped f32 .npy
    for what, n in (("query heads", cfg.heads), ("FFN width", cfg.ffn)):
        if n % nproc:
            raise SystemExit(f"gemma: T = {nproc} processes does not divide the {what} ({n})")
    ids = tokenizer.load().encode(artifacts.lee_corpus(), bos=False)
    tokens = evaluate.windows(ids, S, B, cfg.bos, opts["skip"])
    mesh = Mesh(np.asarray(devices), (gemma.AXIS,))

    p32 = gemma.model_params(cfg, w)  # the harness's layouts, f32
    specs = gemma.param_specs(p32)

    def own_shard(a, spec):
        """This rank's block of ``a`` along the dimension ``spec`` shards."""
        for dim, name in enumerate(spec):
            if name == gemma.AXIS:
                n = a.shape[dim] // nproc
                a = a[(slice(None),) * dim + (slice(rank * n, (rank + 1) * n),)]
        return a

    def global_param(a, spec, full):
        return jax.make_array_from_single_device_arrays(
            full.shape, NamedSharding(mesh, spec), [jax.device_put(np.ascontiguousarray(a), local)])

    local16 = gemma.cast_params(jax.tree.map(own_shard, p32, specs), jnp.bfloat16)
    params = jax.tree.map(global_param, local16, specs, p32)
    del local16, p32
    toks = jax.make_array_from_single_device_arrays(
        tokens.shape, NamedSharding(mesh, P()), [jax.device_put(tokens, local)])

    def make(impl):
        reduce = functools.partial(impl, axis=gemma.AXIS)

        def body(p, t):
            return gemma.forward(p, t, cfg, reduce=reduce)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P()), out_specs=P(),
                                     check_vma=False))

    def exact():
        """The f32 forward on this process's device alone (the harness's
        reference): what the bf16 TP programs approximate."""
        ref32 = jax.device_put(gemma.model_params(cfg, w), local)
        out = gemma.single_device(cfg)(ref32, jax.device_put(tokens, local))
        return np.asarray(out).astype(np.float64)

    return {"workload": "gemma", "size": f"gemma3-270m b{B} s{S}",
            "bytes": 2 * cfg.layers * B * S * cfg.width * 2, "make": make,
            "args": (params, toks), "exact": exact}


def report_summary(op: dict) -> dict:
    """What equarx's report says of one collective, without the bulk."""
    plan = op.get("plan") or {}
    cfg = plan.get("config") or {}
    return {"opcode": op.get("opcode"), "shape": op.get("shape"), "rewritten": op.get("rewritten"),
            "reason": op.get("reason"), "algorithm": plan.get("algorithm"),
            "rotation": plan.get("rotation"), "form": plan.get("form"),
            "format": cfg.get("format"), "lanes": plan.get("lanes"),
            "predicted_rel_rms": op.get("predicted_rel_rms"),
            "wire_bytes": [op.get("wire_bytes_before"), op.get("wire_bytes_after")]}


def variant_name(cfg: str) -> str:
    """``pre-b64-d1`` → ``equarx-pre:b64-d1``; ``b64-d2`` → ``equarx:b64-d2``."""
    toks = cfg.split("-")
    return ("equarx-pre:" if "pre" in toks else "equarx:") + "-".join(t for t in toks if t != "pre")


def compile_before_fusion(jitted, args, cfg: str, nproc: int):
    """equarx where XLA's C++ pass would sit (before fusion), instead of
    the JAX door's pre-scheduler stage (after fusion, where the ring's
    element-wise ops stay unfused): the lowered module is rewritten with
    equarx's C ABI, then XLA compiles the result as usual (fusion
    included). A way to measure the emitted HLO as XLA would fuse it; not a
    door users have."""
    import equarx
    import equarx.jax as ej
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib import _jax, xla_client
    from jax._src.lib.mlir import ir

    opts = config_options(cfg)
    lowered = jitted.lower(*args)
    proto = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    pass_opts = ej.options(**{k: v for k, v in opts.items() if k != "platforms"})
    pass_opts.update(replica_count=1, num_partitions=nproc)  # JAX SPMD: one replica
    res = equarx.rewrite(proto, pass_opts)
    if res.changed:
        text = _jax.mlir.xla_computation_to_mlir_module(xla_client.XlaComputation(res.module))
        with jmlir.make_ir_context():
            lowered._lowering._hlo = ir.Module.parse(text)
    # ``exact``: compile without excess precision. equarx's emitted HLO has
    # no float convert round trip for XLA to drop, so results must agree.
    exact = {"xla_allow_excess_precision": False} if "exact" in cfg.split("-") else None
    return lowered.compile(compiler_options=exact), res.report


def check_output(row: dict, out, reference, wl: dict, with_exact: bool):
    """Hash and errors of one program's (local) output into ``row``; returns
    the reference for the next programs (the output of the workload's plain
    program, e.g. psum, which runs first; ``err_vs_psum`` is against it)."""
    import numpy as np

    got = np.asarray(out.addressable_shards[0].data).astype(np.float32)
    row["sha1"] = hashlib.sha1(got.tobytes()).hexdigest()
    row["finite"] = bool(np.isfinite(got).all())
    if row["variant"] == wl["plain"]:
        reference = got
    if reference is not None:
        row["err_vs_psum"] = rel_rms(got, reference)
    if with_exact and wl["exact"] is not None:
        if "exact_sum" not in wl:
            wl["exact_sum"] = wl["exact"]()
        row["err_vs_exact"] = rel_rms(got, wl["exact_sum"])
    return reference


def rel_rms(got, ref) -> float:
    import numpy as np

    return float(np.sqrt(np.mean((got - ref) ** 2)) / np.sqrt(np.mean(ref.astype(np.float64) ** 2)))


# ---------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax._src.xla_bridge as xb

    # Gloo binds to and advertises the hostname's address (127.0.0.1 here);
    # inside a namespace the peers would dial their own loopback.
    make_gloo = xb._jax.make_gloo_tcp_collectives

    def gloo_on_own_address(distributed_client, hostname=None, interface=None):
        return make_gloo(distributed_client=distributed_client, hostname=args.address)

    xb._jax.make_gloo_tcp_collectives = gloo_on_own_address
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    t_start = time.time()
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id,
                               initialization_timeout=120, heartbeat_timeout_seconds=30,
                               shutdown_timeout_seconds=30)
    from jax._src import distributed
    client = distributed.global_state.client
    rank = jax.process_index()
    timeout_ms = int(args.barrier_timeout * 1000)
    barrier_no = [0]

    def barrier(tag):
        barrier_no[0] += 1
        client.wait_at_barrier(f"eqxc/{barrier_no[0]}/{tag}", timeout_ms)

    result = {"rank": rank, "address": args.address, "jax": jax.__version__,
              "devices": [str(d) for d in jax.devices()], "phases": [], "programs": []}

    def save():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.out)

    try:
        np, workloads = build(args)
        import equarx
        import equarx.jax as ej
        result["equarx_library"] = str(equarx.library_path())
        result["startup_s"] = time.time() - t_start

        # ---- compile everything once (baselines first, then each equarx configuration)
        baselines = [b for b in args.baselines.split(",") if b]
        unknown = [b for b in baselines if not any(b in v for v in BASELINES.values())]
        if unknown:
            raise SystemExit(f"unknown baselines {unknown}: each workload has its own {BASELINES}")
        variants = [(b, None) for b in baselines]
        configs = {"allreduce": args.configs, "reducescatter": args.reducescatter_configs,
                   "allgather": args.allgather_configs, "prefill": args.prefill_configs,
                   "gemma": args.gemma_configs}
        configs = {k: [c for c in v.split(",") if c] for k, v in configs.items()}
        for wl in workloads:
            wl["variants"] = ([b for b in baselines if b in wl["impls"]]
                              + [variant_name(c) for c in configs[wl["workload"]]])
        for c in sum((configs[w] for w in dict.fromkeys(wl["workload"] for wl in workloads)), []):
            if (variant_name(c), c) not in variants:
                variants.append((variant_name(c), c))
        programs = []
        for vname, cfg in variants:
            ej.disable()
            jax.clear_caches()
            pre = cfg is not None and "pre" in cfg.split("-")
            if cfg is not None and not pre:
                ej.enable(**config_options(cfg))
                jax.clear_caches()
            for wl in workloads:
                if vname not in wl["variants"]:
                    continue
                barrier(f"compile {vname} {wl['size']}")
                t = time.time()
                plain = wl["impls"][wl["plain"]]
                if cfg is None:
                    exe, rep = wl["make"](wl["impls"][vname]).lower(*wl["args"]).compile(), []
                elif pre:
                    exe, rep = compile_before_fusion(wl["make"](plain), wl["args"],
                                                     cfg, jax.process_count())
                else:
                    # last_report() keeps the last non-empty report: clear
                    # it so that a module equarx saw nothing in reports none.
                    with ej._lock:
                        ej._last_report = None
                    exe = wl["make"](plain).lower(*wl["args"]).compile()
                    rep = ej.last_report() or []
                secs = time.time() - t
                text = exe.as_text()
                if args.dump_hlo and rank == 0:
                    os.makedirs(args.dump_hlo, exist_ok=True)
                    fn = f"{wl['workload']}-{wl['size']}-{vname}".replace(" ", "_").replace(":", "_")
                    with open(os.path.join(args.dump_hlo, fn + ".hlo.txt"), "w") as f:
                        f.write(text)
                info = {"workload": wl["workload"], "size": wl["size"], "bytes": wl["bytes"],
                        "variant": vname, "compile_s": secs, "wire_types": wire_types(text),
                        "rewritten": sum(1 for r in rep if r.get("rewritten")),
                        "all_reduces": len(rep),  # the collectives equarx looked at
                        "report": [report_summary(r) for r in rep],
                        # what equarx's report says one rank sends, before and after
                        "report_wire_bytes": [sum(r.get("wire_bytes_before") or 0 for r in rep),
                                              sum(r.get("wire_bytes_after") or 0 for r in rep)]}
                programs.append((wl, vname, exe, dict(info, hlo_text=text) if args.profile else info))
                result["programs"].append(info)
                save()
        ej.disable()

        # ---- time every program, one phase per link rate
        rates = [r for r in args.rates.split(",") if r] or [""]
        for rate in rates:
            barrier(f"rate {rate}")
            if rate:
                for cmd in shape_cmds(rate, args.iface, args.switch_netns, args.switch_port):
                    subprocess.run(cmd, check=True, timeout=10, capture_output=True)
                time.sleep(0.2)
            barrier(f"shaped {rate}")
            phase = {"rate": rate or "unshaped", "results": []}
            result["phases"].append(phase)
            # Variants of one workload and size take turns, run by run, so
            # that the machine's other load falls on all of them alike.
            groups: dict[tuple, list] = {}
            for prog in programs:
                groups.setdefault((prog[0]["workload"], prog[0]["size"]), []).append(prog)
            for group in groups.values():  # the plain program first: the reference
                group.sort(key=lambda prog: prog[1] != prog[0]["plain"])
            for (workload, size), group in groups.items():
                for wl, vname, exe, info in group:
                    for i in range(args.warmup):
                        barrier(f"warm {rate} {vname} {size} {i}")
                        exe(*wl["args"]).block_until_ready()
                rows = {vname: {"workload": workload, "size": size, "bytes": wl["bytes"],
                                "variant": vname, "plain": wl["plain"], "times": [], "tc_bytes": 0}
                        for wl, vname, exe, info in group}
                reference = None  # the plain program's output (psum): the unquantized run
                for i in range(args.iters):
                    last = i == args.iters - 1
                    for wl, vname, exe, info in group:
                        row = rows[vname]
                        b0 = tc_bytes(args.iface)
                        barrier(f"time {rate} {vname} {size} {i}")
                        t = time.perf_counter()
                        out = exe(*wl["args"])
                        out.block_until_ready()
                        row["times"].append(time.perf_counter() - t)
                        # Once every rank is done, every byte of this run has
                        # left every link: count them before the next run.
                        barrier(f"done {rate} {vname} {size} {i}")
                        b1 = tc_bytes(args.iface)
                        row["tc_bytes"] = None if b0 is None else row["tc_bytes"] + b1 - b0
                        if last:
                            reference = check_output(row, out, reference, wl, rank == 0 and rate == rates[0])
                        del out
                for wl, vname, exe, info in group:
                    row = rows[vname]
                    row["tc_bytes_per_run"] = None if row["tc_bytes"] is None else row.pop("tc_bytes") / args.iters
                    if args.profile:
                        barrier(f"profile {rate} {vname} {size}")
                        d = os.path.join(args.profile, f"rank{rank}", re.sub(r"\W+", "_", f"{rate}-{vname}-{size}"))
                        row["profile"] = trace_summary.profile_run(
                            lambda: exe(*wl["args"]).block_until_ready(), info["hlo_text"], d)
                    phase["results"].append(row)
                save()
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001 - report everything, then fail
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()
        save()
        raise
    finally:
        result["total_s"] = time.time() - t_start
        save()
    try:
        jax.distributed.shutdown()
    except Exception:  # noqa: BLE001 - the results are written already
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
