"""Llama-family model shapes as named presets: enough to write a config and count bytes, no weights."""

from dataclasses import dataclass

from base.errors import HarvestError


@dataclass(frozen=True, slots=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 8192
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    bos_token_id: int = 128000
    """Llama-3's <|begin_of_text|>; only meaningful with the real tokenizer, kept so configs match."""
    eos_token_id: int = 128001

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise HarvestError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise HarvestError(f"{self.num_attention_heads} heads do not group into {self.num_key_value_heads} KV heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight of LlamaForCausalLM by its HF name, in layer order."""
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        shapes = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
            }
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes

    def num_parameters(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def decode_weight_bytes(self, dtype_bytes: int, batch_size: int = 1) -> int:
        """Weight bytes one decode step reads: every matrix once, but only `batch_size` rows of the embedding."""
        gathered = self.vocab_size * self.hidden_size - batch_size * self.hidden_size
        return (self.num_parameters() - gathered) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def hf_config(self, torch_dtype: str) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "initializer_range": 0.02,
            "torch_dtype": torch_dtype,
        }

    @classmethod
    def from_name(cls, name: str) -> "ModelShape":
        if name not in SHAPES:
            raise HarvestError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
        return SHAPES[name]


SHAPES = {
    # meta-llama/Meta-Llama-3-8B's config.json.
    "llama3-8b": ModelShape(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                            num_key_value_heads=8, intermediate_size=14336),
    # meta-llama/Llama-3.2-1B's config.json (ties its embedding and output head).
    "llama3.2-1b": ModelShape(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                              num_key_value_heads=8, intermediate_size=8192, tie_word_embeddings=True),
    # Tests and CPU hosts: the Llama-3 layout (GQA 4:1) at a size a CPU decodes in milliseconds.
    "tiny": ModelShape(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=1, intermediate_size=224, max_position_embeddings=2048,
                       bos_token_id=1, eos_token_id=2),
}
