"""TrainingSetup: what LlamaFactory and its HF Trainer decide for a job, built by their own code.

The PEFT model, tokenizer, dataset and collator come from LlamaFactory's SFT workflow functions; the data
order, optimizer, LR schedule, step count and save interval come from a LlamaFactory trainer object whose
training loop is never run. harvest's engine only replaces that loop.

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch

from harvest.finetune.llamafactory_args import LlamaFactoryArgs


@dataclass(frozen=True, slots=True)
class TrainingSetup:
    peft_model: Any
    tokenizer: Any
    dataloader: Any
    """The Trainer's own train dataloader (its sampler, seed and collator); `set_epoch` reshuffles."""
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    max_steps: int
    num_update_steps_per_epoch: int
    num_batches_per_epoch: int
    num_grad_accum_steps: int
    max_grad_norm: float
    model_accepts_loss_kwargs: bool
    """True: the loss is a token sum over the accumulation window / its labelled tokens (HF Trainer)."""
    save_every_steps: int | None
    save_each_epoch: bool
    autocast_dtype: torch.dtype | None

    @classmethod
    def build(cls, llamafactory: LlamaFactoryArgs, data_shard: tuple[int, int] | None = None) -> "TrainingSetup":
        """`data_shard` (K, N): the Trainer sees shard K of N of the tokenized dataset (a fleet worker's share)."""
        from llamafactory.data import (
            SFTDataCollatorWith4DAttentionMask,
            get_dataset,
            get_template_and_fix_tokenizer,
        )
        from llamafactory.extras.constants import IGNORE_INDEX
        from llamafactory.model import load_model, load_tokenizer

        model_args, data_args, training_args = llamafactory.model_args, llamafactory.data_args, llamafactory.training_args
        # Frozen weights start in host memory; the layer swapper decides what reaches the device.
        model_args.device_map = {"": "cpu"}
        # The call order of llamafactory.train.sft.workflow.run_sft, so the seeded RNG draws the same LoRA init.
        tokenizer_module = load_tokenizer(model_args)
        tokenizer = tokenizer_module["tokenizer"]
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        dataset_module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
        if data_shard is not None:
            index, num_shards = data_shard
            dataset = dataset_module["train_dataset"]
            if len(dataset) < num_shards:
                raise ValueError(f"the dataset has {len(dataset)} samples, fewer than the {num_shards} shards")
            dataset_module = {**dataset_module, "train_dataset": dataset.shard(num_shards, index, contiguous=True)}
        model = load_model(tokenizer, model_args, llamafactory.finetuning_args, is_trainable=True)
        collator = SFTDataCollatorWith4DAttentionMask(
            template=template,
            model=model,
            pad_to_multiple_of=8,
            label_pad_token_id=IGNORE_INDEX if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id,
            block_diag_attn=model_args.block_diag_attn,
            neat_packing=data_args.neat_packing,
            attn_implementation=getattr(model.config, "_attn_implementation", None),
            compute_dtype=model_args.compute_dtype,
            **tokenizer_module,
        )
        trainer = _loop_free_trainer(model, llamafactory, collator, dataset_module, tokenizer_module)
        dataloader = trainer.get_train_dataloader()
        values = trainer.set_initial_training_values(training_args, dataloader)
        _, num_update_steps_per_epoch, _, _, _, num_batches_per_epoch, max_steps = values
        optimizer = trainer.create_optimizer()
        lr_scheduler = trainer.create_scheduler(num_training_steps=max_steps)

        base = model.get_base_model()
        if getattr(base, "is_gradient_checkpointing", False):
            base.gradient_checkpointing_disable()  # backward units recompute each layer themselves
        model.train()
        return cls(
            peft_model=model,
            tokenizer=tokenizer,
            dataloader=dataloader,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            max_steps=max_steps,
            num_update_steps_per_epoch=num_update_steps_per_epoch,
            num_batches_per_epoch=num_batches_per_epoch,
            num_grad_accum_steps=training_args.gradient_accumulation_steps,
            max_grad_norm=training_args.max_grad_norm,
            model_accepts_loss_kwargs=trainer.model_accepts_loss_kwargs,
            save_every_steps=_save_interval(training_args, max_steps),
            save_each_epoch=_strategy(training_args.save_strategy) == "epoch",
            autocast_dtype=torch.bfloat16 if training_args.bf16 else None,
        )


def _strategy(value) -> str:
    return str(getattr(value, "value", value))


def _save_interval(training_args, max_steps: int) -> int | None:
    if _strategy(training_args.save_strategy) != "steps":
        return None
    save_steps = training_args.save_steps
    if save_steps is None or save_steps <= 0:
        return None
    # A save_steps below 1 is a fraction of the run, as in TrainerState.compute_steps.
    return math.ceil(max_steps * save_steps) if save_steps < 1 else int(save_steps)


def _loop_free_trainer(model, llamafactory: LlamaFactoryArgs, collator, dataset_module, tokenizer_module):
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    class LoopFreeTrainer(CustomSeq2SeqTrainer):
        def _move_model_to_device(self, model, device):
            pass  # the layer swapper places weights; the whole model must not land on the device

    return LoopFreeTrainer(
        model=model,
        args=llamafactory.training_args,
        finetuning_args=llamafactory.finetuning_args,
        data_collator=collator,
        **dataset_module,
        **tokenizer_module,
    )
