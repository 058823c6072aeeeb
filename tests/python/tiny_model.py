"""Writes a tiny GGUF of a real architecture with random weights, the
vocabulary of a real tokenizer and a real chat template: the model cortex's
tests run the real path on (render, tokenize, generate, read the output)
without the real weights. What it generates is noise; a test's grammar
decides the text.

Usage: tiny_model.py OUT.gguf ARCH VOCAB.gguf TEMPLATE.jinja
  ARCH: llama, qwen2 or qwen3; VOCAB.gguf: a vocab-only GGUF
  (llama.cpp's models/ggml-vocab-*.gguf), whose tokenizer is copied.
"""

import sys

import gguf
import numpy as np

OUT, ARCH, VOCAB, TEMPLATE = sys.argv[1:5]
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, CONTEXT = 64, 4, 2, 128, 2, 4096
HEAD_DIM = N_EMBD // N_HEAD

rng = np.random.default_rng(7)
vocab = gguf.GGUFReader(VOCAB)


def field(name):
    return vocab.fields.get(name)


def strings(name):
    f = field(name)
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def scalar(name):
    f = field(name)
    return None if f is None else f.parts[f.data[0]][0].item()


tokens = strings("tokenizer.ggml.tokens")
writer = gguf.GGUFWriter(OUT, ARCH)
writer.add_name(f"tiny-{ARCH}")
writer.add_context_length(CONTEXT)
writer.add_embedding_length(N_EMBD)
writer.add_block_count(N_LAYER)
writer.add_feed_forward_length(N_FF)
writer.add_head_count(N_HEAD)
writer.add_head_count_kv(N_HEAD_KV)
writer.add_rope_dimension_count(HEAD_DIM)
writer.add_rope_freq_base(10000.0)
writer.add_layer_norm_rms_eps(1e-6)
writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
if ARCH == "qwen3":
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)

# The tokenizer, as the vocabulary's GGUF has it.
writer.add_tokenizer_model(bytes(field("tokenizer.ggml.model").parts[-1]).decode())
pre = field("tokenizer.ggml.pre")
if pre is not None:
    writer.add_tokenizer_pre(bytes(pre.parts[-1]).decode())
writer.add_token_list(tokens)
types = field("tokenizer.ggml.token_type")
writer.add_token_types([int(types.parts[i][0]) for i in types.data])
scores = field("tokenizer.ggml.scores")
if scores is not None:
    writer.add_token_scores([float(scores.parts[i][0]) for i in scores.data])
if field("tokenizer.ggml.merges") is not None:
    writer.add_token_merges(strings("tokenizer.ggml.merges"))
for key, add in [
    ("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
    ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
    ("tokenizer.ggml.padding_token_id", writer.add_pad_token_id),
]:
    value = scalar(key)
    if value is not None:
        add(int(value))
add_bos = scalar("tokenizer.ggml.add_bos_token")
if add_bos is not None:
    writer.add_add_bos_token(bool(add_bos))
with open(TEMPLATE, encoding="utf-8") as f:
    writer.add_chat_template(f.read())


def weights(*shape):
    return (rng.standard_normal(shape) * 0.02).astype(np.float16)


def ones(n):
    return np.ones(n, dtype=np.float32)


writer.add_tensor("token_embd.weight", weights(len(tokens), N_EMBD))
writer.add_tensor("output_norm.weight", ones(N_EMBD))
for i in range(N_LAYER):
    blk = f"blk.{i}"
    writer.add_tensor(f"{blk}.attn_norm.weight", ones(N_EMBD))
    writer.add_tensor(f"{blk}.attn_q.weight", weights(N_HEAD * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"{blk}.attn_k.weight", weights(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"{blk}.attn_v.weight", weights(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"{blk}.attn_output.weight", weights(N_EMBD, N_HEAD * HEAD_DIM))
    if ARCH == "qwen2":
        writer.add_tensor(f"{blk}.attn_q.bias", np.zeros(N_HEAD * HEAD_DIM, dtype=np.float32))
        writer.add_tensor(f"{blk}.attn_k.bias", np.zeros(N_HEAD_KV * HEAD_DIM, dtype=np.float32))
        writer.add_tensor(f"{blk}.attn_v.bias", np.zeros(N_HEAD_KV * HEAD_DIM, dtype=np.float32))
    if ARCH == "qwen3":
        writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(HEAD_DIM))
        writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(HEAD_DIM))
    writer.add_tensor(f"{blk}.ffn_norm.weight", ones(N_EMBD))
    writer.add_tensor(f"{blk}.ffn_gate.weight", weights(N_FF, N_EMBD))
    writer.add_tensor(f"{blk}.ffn_up.weight", weights(N_FF, N_EMBD))
    writer.add_tensor(f"{blk}.ffn_down.weight", weights(N_EMBD, N_FF))

writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
print(OUT)
