"""Reading a Hugging Face config field by field: every key is either mapped onto a blocklab
option, checked to hold a value blocklab computes identically, or known not to change the
computation. Anything else is refused in one line naming the key and its value — an importer
never drops a field silently."""

from __future__ import annotations

from typing import Any

from blocklab.errors import ConfigError

# Keys of any Hugging Face config that do not change what the network computes from its inputs
# (bookkeeping, generation defaults, token ids the tokenizer owns, initialization, runtime
# switches). Dropout is mapped where blocklab has it; where it has not, a note says so.
NON_ARCHITECTURAL = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype",
    "torch_dtype", "use_cache", "initializer_range", "initializer_factor", "id2label",
    "label2id", "num_labels", "problem_type", "finetuning_task", "task_specific_params",
    "tokenizer_class", "prefix", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "unk_token_id", "mask_token_id", "decoder_start_token_id", "output_attentions",
    "output_hidden_states", "return_dict", "use_return_dict", "torchscript",
    "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
    "gradient_checkpointing", "chunk_size_feed_forward", "transformers.js_config",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "n_ctx", "tf_legacy_loss",
    "use_bfloat16", "cross_attention_hidden_size", "is_llama_config", "keys_to_ignore_at_inference",
})


class Fields:
    """One Hugging Face config being read: ``take`` maps a key, ``expect`` checks one,
    ``finish`` refuses whatever is left. ``ignore`` names keys the user declared harmless."""

    def __init__(self, config: dict[str, Any], where: str, *, ignore: tuple[str, ...] = ()):
        self.config, self.where = dict(config), where
        self.left = set(config) - NON_ARCHITECTURAL - set(ignore)
        self.notes: list[str] = []

    def take(self, key: str, default: Any = None, *aliases: str) -> Any:
        """The value of ``key`` (or the first alias present), ``default`` when absent."""
        for k in (key, *aliases):
            self.left.discard(k)
        for k in (key, *aliases):
            if k in self.config and self.config[k] is not None:
                return self.config[k]
        return default

    def take_nullable(self, key: str, default: Any) -> Any:
        """Like ``take``, for a key whose explicit null means something (``sliding_window:
        null`` = no window): ``default`` only when the key is absent."""
        self.left.discard(key)
        return self.config.get(key, default)

    def expect(self, key: str, allowed: tuple[Any, ...], why: str) -> Any:
        """``key`` must be absent or one of ``allowed`` (its first entry is the default)."""
        value = self.take(key, allowed[0])
        if value not in allowed:
            self.refuse(key, value, why)
        return value

    def refuse(self, key: str, value: Any, why: str) -> None:
        raise ConfigError(f"hf config {self.where}: {key}={value!r}: {why}")

    def finish(self) -> list[str]:
        """Refuse the first key nobody read; return the notes."""
        for key in sorted(self.left):
            self.refuse(key, self.config[key],
                        "blocklab cannot express it (not a field this importer maps); if it "
                        "does not change the computation, pass ignore_fields=[" + key + "]")
        return self.notes
