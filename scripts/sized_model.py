#!/usr/bin/env python3
"""Random-weight GGUFs with the exact shapes of the models people batch with.

    python3 scripts/sized_model.py llama3.2-1b              # Q4_K_M, into target/sized-models/
    python3 scripts/sized_model.py qwen2.5-7b --type q8_0 --out /tmp/q.gguf
    python3 scripts/sized_model.py llama3.1-8b --type f16    # what a GPU's cuBLAS path takes
    python3 scripts/sized_model.py --list

Each model has its real architecture, every tensor at its real shape and in
the type llama.cpp's `llama-quantize` gives it (Q4_K_M: Q6_K for the output
projection, and for attn_v and ffn_down in the layers `use_more_bits` picks,
Q4_K elsewhere; Q8_0: every matrix; F16: every matrix, unquantized), its real tokenizer (copied from a
vocab-only GGUF: the llama-cpp-python sdist's `models/ggml-vocab-*.gguf`, or
for Gemma 3 the gemma3-270m GGUF, `--vocab FILE`) and its real chat template
(the sdist's `models/templates/`). The quantized blocks are written directly:
random quants under scales that give weights of standard deviation 0.02 (as
models are initialised), so an 8B model takes seconds and no F16 copy.
`--via-quantize LLAMA_QUANTIZE` writes random F16 weights instead and runs
llama.cpp's own quantizer over them (minutes, and an F16 file of twice the
size), to check the direct writer's types against it.

Random weights generate noise: whoever measures with these fixes the token
counts (`ignore_eos`, max_tokens). Nothing made here is committed; the files
are cached (`target/sized-models/NAME-TYPE.gguf`, remade with --force). Only
Python's standard library is used, so the script runs where nothing can be
installed (the GPU kit carries it).
"""

import argparse
import math
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

# ------------------------------------------------------------------ shapes

# The text models as their published configs give them (vocab: the
# tokenizer's own size; Qwen pads its embedding rows to 152,064).
MODELS = {
    "llama3.2-1b": dict(arch="llama", layers=16, embd=2048, ff=8192, heads=32, kv_heads=8,
                        head_dim=64, tied=True, vocab="llama-bpe", rope_base=500000.0,
                        rope_llama3=32.0, eps=1e-5, ctx=131072,
                        template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "llama3.2-3b": dict(arch="llama", layers=28, embd=3072, ff=8192, heads=24, kv_heads=8,
                        head_dim=128, tied=True, vocab="llama-bpe", rope_base=500000.0,
                        rope_llama3=32.0, eps=1e-5, ctx=131072,
                        template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "llama3.1-8b": dict(arch="llama", layers=32, embd=4096, ff=14336, heads=32, kv_heads=8,
                        head_dim=128, tied=False, vocab="llama-bpe", rope_base=500000.0,
                        rope_llama3=8.0, eps=1e-5, ctx=131072,
                        template="meta-llama-Llama-3.1-8B-Instruct.jinja"),
    "qwen2.5-7b": dict(arch="qwen2", layers=28, embd=3584, ff=18944, heads=28, kv_heads=4,
                       head_dim=128, tied=False, vocab="qwen2", vocab_rows=152064,
                       rope_base=1000000.0, eps=1e-6, ctx=32768, qkv_bias=True,
                       template="Qwen-Qwen2.5-7B-Instruct.jinja"),
    "gemma3-4b": dict(arch="gemma3", layers=34, embd=2560, ff=10240, heads=8, kv_heads=4,
                      head_dim=256, tied=True, vocab="gemma3", rope_base=1000000.0, eps=1e-6,
                      ctx=131072, sliding_window=1024, rope_linear=8.0, template=None),
}

TYPES = ("q4_k_m", "q8_0", "f16")
# The tokenizers' sizes, for --list (the files say it when a model is made).
TOKENS = {"llama-bpe": 128256, "qwen2": 151936, "gemma3": 262144}

# ggml's types: (id, elements a block, bytes a block).
F32, F16, Q8_0, Q4_K, Q6_K = (0, 1, 4), (1, 1, 2), (8, 32, 34), (12, 256, 144), (14, 256, 210)
FILE_TYPE = {"q4_k_m": 15, "q8_0": 7, "f16": 1}  # llama_ftype
QUANTIZE_NAME = {"q4_k_m": "Q4_K_M", "q8_0": "Q8_0", "f16": "F16"}


def use_more_bits(i, n):
    """llama-quant.cpp's rule for the Q4_K_M layers that get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(spec, vocab_rows, kind):
    """Every tensor as (name, dims with ne[0] first, ggml type, fill)."""
    e, f, h, kv, d, n = (spec[k] for k in ("embd", "ff", "heads", "kv_heads", "head_dim", "layers"))

    def matrix(name, cols, rows, more_bits=False):
        if kind == "q8_0":
            t = Q8_0
        elif kind == "f16":
            t = F16
        else:
            t = Q6_K if more_bits else Q4_K
        return (name, [cols, rows], t, "weights")

    out = []
    # The output projection's type goes to the embedding it is tied to.
    embd_more_bits = spec["tied"]
    out.append(matrix("token_embd.weight", e, vocab_rows, embd_more_bits))
    for i in range(n):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", [e], F32, "ones"))
        out.append(matrix(b + "attn_q.weight", e, h * d))
        out.append(matrix(b + "attn_k.weight", e, kv * d))
        out.append(matrix(b + "attn_v.weight", e, kv * d, use_more_bits(i, n)))
        if spec.get("qkv_bias"):
            out.append((b + "attn_q.bias", [h * d], F32, "zeros"))
            out.append((b + "attn_k.bias", [kv * d], F32, "zeros"))
            out.append((b + "attn_v.bias", [kv * d], F32, "zeros"))
        if spec["arch"] == "gemma3":
            out.append((b + "attn_q_norm.weight", [d], F32, "ones"))
            out.append((b + "attn_k_norm.weight", [d], F32, "ones"))
        out.append(matrix(b + "attn_output.weight", h * d, e))
        if spec["arch"] == "gemma3":
            out.append((b + "post_attention_norm.weight", [e], F32, "ones"))
        out.append((b + "ffn_norm.weight", [e], F32, "ones"))
        out.append(matrix(b + "ffn_gate.weight", e, f))
        out.append(matrix(b + "ffn_up.weight", e, f))
        out.append(matrix(b + "ffn_down.weight", f, e, use_more_bits(i, n)))
        if spec["arch"] == "gemma3":
            out.append((b + "post_ffw_norm.weight", [e], F32, "ones"))
    out.append(("output_norm.weight", [e], F32, "ones"))
    if not spec["tied"]:
        out.append(matrix("output.weight", e, vocab_rows, True))
    if spec.get("rope_llama3"):
        out.append(("rope_freqs.weight", [d // 2], F32, "rope_llama3"))
    return out


def llama3_rope_factors(spec):
    """The frequency factors Llama 3.1+ store (convert_hf_to_gguf.py's)."""
    d, base, factor = spec["head_dim"], spec["rope_base"], spec["rope_llama3"]
    low, high, old_ctx = 1.0, 4.0, 8192
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for i in range(0, d, 2):
        freq = 1.0 / (base ** (i / d))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def hparams(spec, vocab_rows):
    a = spec["arch"]
    kv = {
        "general.architecture": ("str", a),
        f"{a}.block_count": ("u32", spec["layers"]),
        f"{a}.context_length": ("u32", spec["ctx"]),
        f"{a}.embedding_length": ("u32", spec["embd"]),
        f"{a}.feed_forward_length": ("u32", spec["ff"]),
        f"{a}.attention.head_count": ("u32", spec["heads"]),
        f"{a}.attention.head_count_kv": ("u32", spec["kv_heads"]),
        f"{a}.attention.key_length": ("u32", spec["head_dim"]),
        f"{a}.attention.value_length": ("u32", spec["head_dim"]),
        f"{a}.rope.freq_base": ("f32", spec["rope_base"]),
        f"{a}.attention.layer_norm_rms_epsilon": ("f32", spec["eps"]),
    }
    if a == "llama":
        kv[f"{a}.rope.dimension_count"] = ("u32", spec["head_dim"])
        kv[f"{a}.vocab_size"] = ("u32", vocab_rows)
    if spec.get("sliding_window"):
        kv[f"{a}.attention.sliding_window"] = ("u32", spec["sliding_window"])
    if spec.get("rope_linear"):
        kv[f"{a}.rope.scaling.type"] = ("str", "linear")
        kv[f"{a}.rope.scaling.factor"] = ("f32", spec["rope_linear"])
    return kv

# -------------------------------------------------------------- GGUF files

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32T, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32T: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
ALIGNMENT = 32


class Reader:
    """A GGUF's metadata, read with the standard library (tensor data unread)."""

    def __init__(self, path):
        self.f = open(path, "rb")
        if self.f.read(4) != b"GGUF":
            raise SystemExit(f"{path} is not a GGUF file")
        (version,) = struct.unpack("<I", self.f.read(4))
        if version < 2:
            raise SystemExit(f"{path}: GGUF version {version} is too old")
        n_tensors, n_kv = struct.unpack("<QQ", self.f.read(16))
        self.kv = {}
        for _ in range(n_kv):
            key = self.string()
            (vtype,) = struct.unpack("<I", self.f.read(4))
            self.kv[key] = (vtype, self.value(vtype))
        self.tensors = []
        for _ in range(n_tensors):
            name = self.string()
            (n_dims,) = struct.unpack("<I", self.f.read(4))
            dims = struct.unpack(f"<{n_dims}Q", self.f.read(8 * n_dims))
            ttype, _offset = struct.unpack("<IQ", self.f.read(12))
            self.tensors.append((name, list(dims), ttype))
        self.f.close()

    def string(self):
        (n,) = struct.unpack("<Q", self.f.read(8))
        return self.f.read(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype == STR:
            return self.string()
        if vtype == ARR:
            etype, n = struct.unpack("<IQ", self.f.read(12))
            if etype in SCALAR:
                fmt = SCALAR[etype]
                size = struct.calcsize(fmt)
                raw = self.f.read(size * n)
                return (etype, list(struct.unpack(f"<{n}{fmt[1]}", raw)))
            return (etype, [self.value(etype) for _ in range(n)])
        fmt = SCALAR[vtype]
        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))[0]


def encode_string(text):
    raw = text.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype, value):
    if vtype == STR:
        return encode_string(value)
    if vtype == ARR:
        etype, items = value
        head = struct.pack("<IQ", etype, len(items))
        if etype in SCALAR:
            return head + struct.pack(f"<{len(items)}{SCALAR[etype][1]}", *items)
        return head + b"".join(encode_value(etype, item) for item in items)
    return struct.pack(SCALAR[vtype], value)


TYPED = {"str": STR, "u32": U32, "f32": F32T}


def tensor_bytes(dims, ttype):
    _, block, size = ttype
    count = math.prod(dims)
    assert count % block == 0, (dims, ttype)
    return count // block * size


def fp16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]


def random_bytes(rng, n):
    """`n` random bytes (`randbytes` takes at most 256 MiB at a time)."""
    chunk = 1 << 24
    return bytearray(b"".join(rng.randbytes(min(chunk, n - i)) for i in range(0, n, chunk)))


def random_blocks(rng, ttype, nbytes):
    """`nbytes` of quantized blocks: random quants, the scales set so that
    the weights have a standard deviation of about 0.02 and mean about 0."""
    data = random_bytes(rng, nbytes)
    _, _, size = ttype
    n = nbytes // size

    def put(offset, value):
        data[offset::size] = bytes([value]) * n

    def put_half(offset, x):
        bits = fp16_bits(x)
        put(offset, bits & 0xFF)
        put(offset + 1, bits >> 8)

    if ttype == Q4_K:
        # w = d*sc*q - dmin*m, q uniform in 0..15 (sd 4.61): sc = m = 32.
        d = 0.02 / (32 * 4.61)
        put_half(0, d)
        put_half(2, d * 7.5)
        for j in range(12):
            put(4 + j, 160 if j < 8 else 0)  # 6-bit scales and mins, all 32
    elif ttype == Q6_K:
        # w = d*scale*(q - 32), q uniform in 0..63 (sd 18.5): scale 8.
        for j in range(16):
            put(192 + j, 8)
        put_half(208, 0.02 / (8 * 18.5))
    elif ttype == Q8_0:
        # w = d*q, q uniform in -128..127 (sd 73.9).
        put_half(0, 0.02 / 73.9)
    return data


def random_f16(rng, count, pool=[]):
    """F16 weights of about 0.02 (sign, exponent 2^-6 or 2^-5, mantissa
    random): 32 MiB of random ones made once, each tensor those from a
    random start, repeated as it needs (an 8B model's 15 GiB in seconds)."""
    if not pool:
        data = random_bytes(rng, 1 << 25)
        high = bytes(((b & 0x83) | 0x24) for b in range(256))
        data[1::2] = data[1::2].translate(high)
        pool.append(bytes(data))
    nbytes = count * 2
    start = rng.randrange(len(pool[0]) // 2) * 2
    rotated = pool[0][start:] + pool[0][:start]
    return (rotated * (nbytes // len(rotated) + 1))[:nbytes]


class Writer:
    def __init__(self, path, kv, infos):
        self.path, self.kv, self.infos = path, kv, infos

    def write(self, fill):
        offsets, offset = [], 0
        for name, dims, ttype, _ in self.infos:
            offsets.append(offset)
            offset += -(-tensor_bytes(dims, ttype) // ALIGNMENT) * ALIGNMENT
        head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.infos), len(self.kv)))
        for key, (vtype, value) in self.kv.items():
            head += encode_string(key) + struct.pack("<I", vtype) + encode_value(vtype, value)
        for (name, dims, ttype, _), off in zip(self.infos, offsets):
            head += encode_string(name) + struct.pack("<I", len(dims))
            head += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype[0], off)
        head += bytes(-len(head) % ALIGNMENT)
        temp = self.path.with_name(self.path.name + ".part")
        with open(temp, "wb") as f:
            f.write(head)
            for (name, dims, ttype, what), off in zip(self.infos, offsets):
                data = fill(name, dims, ttype, what)
                f.write(data)
                f.write(bytes(-len(data) % ALIGNMENT))
        os.replace(temp, self.path)

# ------------------------------------------------------------------ making


def find_llama_src(given):
    if given:
        return Path(given)
    root = Path(__file__).resolve().parent.parent
    found = sorted(root.glob("target/peers/llama_cpp_python-*/vendor/llama.cpp"))
    if not found:
        raise SystemExit(
            "the llama.cpp source (for its vocab-only GGUFs and templates) is not here: "
            "run `NO_BUILD=1 bash scripts/build-peers.sh` or give --llama-src DIR")
    return found[-1]


def vocabulary(spec, args):
    """The tokenizer's keys, from a vocab-only GGUF (or a model's)."""
    if args.vocab:
        path = Path(args.vocab)
    elif args.vocab_dir:
        path = Path(args.vocab_dir) / f"ggml-vocab-{spec['vocab']}.gguf"
    elif spec["vocab"] == "gemma3":
        kept = Path(__file__).resolve().parent.parent / "target/sized-models/ggml-vocab-gemma3.gguf"
        if not kept.exists():
            raise SystemExit(
                "Gemma 3's tokenizer comes from the gemma3-270m GGUF: give --vocab PATH (`cortex "
                "models pull gemma3-270m` prints its path), or keep it once with --extract-vocab "
                f"PATH {kept}")
        path = kept
    else:
        path = find_llama_src(args.llama_src) / "models" / f"ggml-vocab-{spec['vocab']}.gguf"
    reader = Reader(path)
    kv = {k: v for k, v in reader.kv.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in kv:
        raise SystemExit(f"{path} holds no tokenizer")
    return path, kv


def pad_vocabulary(kv, rows):
    """Qwen's embedding has more rows than its tokenizer has tokens: the
    rest are padding tokens, as its GGUFs list them."""
    etype, tokens = kv["tokenizer.ggml.tokens"][1]
    extra = rows - len(tokens)
    if extra <= 0:
        return
    kv["tokenizer.ggml.tokens"] = (ARR, (etype, tokens + [f"[PAD{i}]" for i in range(len(tokens), rows)]))
    for key, filler in (("tokenizer.ggml.token_type", 5), ("tokenizer.ggml.scores", 0.0)):
        if key in kv:
            t, values = kv[key][1]
            kv[key] = (ARR, (t, values + [filler] * extra))


def make(name, kind, out, args):
    spec = MODELS[name]
    vocab_path, vocab_kv = vocabulary(spec, args)
    n_tokens = len(vocab_kv["tokenizer.ggml.tokens"][1][1])
    rows = spec.get("vocab_rows", n_tokens)
    pad_vocabulary(vocab_kv, rows)
    kv = {"general.name": (STR, f"{name} (random weights)"),
          "general.file_type": (U32, FILE_TYPE[kind] if not args.via_quantize else 1),
          "general.quantization_version": (U32, 2)}
    for key, (t, value) in hparams(spec, rows).items():
        kv[key] = (TYPED[t], value)
    kv.update(vocab_kv)
    if spec["template"] and "tokenizer.chat_template" not in kv:
        models = Path(args.vocab_dir) if args.vocab_dir else find_llama_src(args.llama_src) / "models"
        template = models / "templates" / spec["template"]
        kv["tokenizer.chat_template"] = (STR, template.read_text())
    infos = tensors(spec, rows, kind)
    if args.via_quantize:
        infos = [(n, d, F16 if w == "weights" else t, w) for n, d, t, w in infos]
    rng = random.Random(args.seed)
    rope = struct.pack(f"<{spec['head_dim'] // 2}f", *llama3_rope_factors(spec)) \
        if spec.get("rope_llama3") else b""

    def fill(tname, dims, ttype, what):
        nbytes = tensor_bytes(dims, ttype)
        if what == "ones":
            return struct.pack("<f", 1.0) * math.prod(dims)
        if what == "zeros":
            return bytes(nbytes)
        if what == "rope_llama3":
            return rope
        if ttype == F16:
            return random_f16(rng, math.prod(dims))
        return random_blocks(rng, ttype, nbytes)

    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    total = sum(tensor_bytes(d, t) for _, d, t, _ in infos)
    if not args.via_quantize:
        print(f"==> {out}: {name} ({spec['arch']}, {spec['layers']} layers, vocabulary of {rows} "
              f"from {vocab_path.name}), {kind.upper()}, {total / 2**30:.2f} GiB of weights",
              file=sys.stderr)
        Writer(out, kv, infos).write(fill)
    else:
        f16 = out.with_name(out.name + ".f16")
        print(f"==> {f16}: random F16 weights, {total / 2**30:.2f} GiB, then "
              f"{args.via_quantize} to {QUANTIZE_NAME[kind]}", file=sys.stderr)
        Writer(f16, kv, infos).write(fill)
        threads = str(os.cpu_count() or 1)
        subprocess.run([args.via_quantize, str(f16), str(out), QUANTIZE_NAME[kind], threads],
                       check=True, stdout=subprocess.DEVNULL)
        f16.unlink()
    print(f"==> {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.time() - started:.1f} s",
          file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", choices=sorted(MODELS))
    parser.add_argument("--type", default="q4_k_m", choices=TYPES)
    parser.add_argument("--out", help="the GGUF to write (default target/sized-models/MODEL-TYPE.gguf)")
    parser.add_argument("--vocab", help="the GGUF whose tokenizer to copy (required for Gemma 3)")
    parser.add_argument("--llama-src", help="llama.cpp's source (default: the peers' sdist under target/peers)")
    parser.add_argument("--vocab-dir", help="a folder of ggml-vocab-NAME.gguf files and a templates/ "
                        "folder, instead of llama.cpp's models/ (the GPU kit's)")
    parser.add_argument("--via-quantize", metavar="LLAMA_QUANTIZE",
                        help="write F16 weights and quantize them with this llama-quantize")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--force", action="store_true", help="make it again even if it is there")
    parser.add_argument("--list", action="store_true", help="list the models and their sizes")
    parser.add_argument("--extract-vocab", nargs=2, metavar=("MODEL_GGUF", "VOCAB_GGUF"),
                        help="write a model's tokenizer alone as a vocab-only GGUF (a few MB: "
                             "what the GPU kit carries for Gemma 3)")
    args = parser.parse_args()
    if args.extract_vocab:
        source, target = (Path(p) for p in args.extract_vocab)
        reader = Reader(source)
        kv = {k: v for k, v in reader.kv.items()
              if k.startswith("tokenizer.") or k == "general.architecture"}
        Writer(target, kv, []).write(None)
        print(target)
        return
    if args.list or not args.model:
        for name, spec in MODELS.items():
            rows = spec.get("vocab_rows", TOKENS[spec["vocab"]])
            params = sum(math.prod(d) for _, d, _, _ in tensors(spec, rows, "q8_0"))
            print(f"{name:12} {spec['arch']:7} {spec['layers']:3} layers  embd {spec['embd']:5}  "
                  f"ff {spec['ff']:6}  heads {spec['heads']}/{spec['kv_heads']}x{spec['head_dim']}  "
                  f"~{params / 1e9:.1f}B parameters")
        return
    root = Path(__file__).resolve().parent.parent
    out = Path(args.out) if args.out else root / "target" / "sized-models" / f"{args.model}-{args.type}.gguf"
    if out.exists() and not args.force:
        print(f"==> {out} is there (--force makes it again)", file=sys.stderr)
    else:
        make(args.model, args.type, out, args)
    print(out)


if __name__ == "__main__":
    main()
