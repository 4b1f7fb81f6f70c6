"""A tiny random Llama with a tokenizer trained in-process: a real HF model directory, no download.

Tests and CPU examples use it where the embedded SmolLM2 would be slow. SGLang serves it, LlamaFactory
loads it, PEFT wraps it: every code path is the real one, only the weights are random.

Deferred imports: torch, transformers and tokenizers only when the model is built; the constants are read without them.
"""

from pathlib import Path

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


def build_tiny_llama(
    out_dir: str | Path,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Path:
    """Write a random Llama and a BPE tokenizer into `out_dir`; reuse the directory if already built."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists() and (out_dir / "tokenizer.json").exists():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    return out_dir
