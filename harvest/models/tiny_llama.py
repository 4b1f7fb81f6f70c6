"""A tiny random Llama with a tokenizer trained in-process: a real HF model directory, no download.

Tests and CPU examples use it where the embedded SmolLM2 would be slow. SGLang serves it, LlamaFactory
loads it, PEFT wraps it: every code path is the real one, only the weights are random.

Deferred imports: torch, transformers and tokenizers only when the model is built; the constants are read without them.
"""

from dataclasses import replace
from pathlib import Path

from harvest.models.model_shape import ModelShape

CORPUS = [
    "harvest finetunes adapters while the decode worker serves requests.",
    "the quick brown fox jumps over the lazy dog.",
    "decode steps are memory bound and leave most streaming multiprocessors idle.",
    "a lora adapter adds a low rank update to a frozen weight matrix.",
    "what is the capital of france? the capital of france is paris.",
    "one two three four five six seven eight nine ten.",
] * 20

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

# A ChatML-style template so `apply_chat_template` and LlamaFactory's templates have something to render.
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


TINY_LLAMA = ModelShape(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=2048,
                        rope_theta=10000.0, rms_norm_eps=1e-6)
"""The tests' model, with HF LlamaConfig's rope and norm defaults (the named "tiny" shape has Llama-3's)."""


def build_tiny_llama(out_dir: str | Path, num_hidden_layers: int = TINY_LLAMA.num_hidden_layers, seed: int = 0) -> Path:
    """Write a random Llama and a BPE tokenizer into `out_dir`; reuse the directory if already built."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "tokenizer.json").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids = write_small_tokenizer(out_dir, TINY_LLAMA.vocab_size)
    shape = replace(TINY_LLAMA, num_hidden_layers=num_hidden_layers, bos_token_id=special_ids["bos_token_id"],
                    eos_token_id=special_ids["eos_token_id"])
    hf_config = {k: v for k, v in shape.hf_config("float32").items() if k not in ("architectures", "model_type")}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**hf_config, pad_token_id=special_ids["pad_token_id"]))
    model.save_pretrained(out_dir)
    return out_dir


def write_small_tokenizer(out_dir: Path, vocab_size: int) -> dict:
    """A byte-level BPE of at most 512 tokens trained on CORPUS, saved in `out_dir` (its ids a subset of a larger
    model's vocabulary); returns the config keys naming its special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(512, vocab_size), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}
