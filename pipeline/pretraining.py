"""The BERT pretraining stage: masked LM + next sentence prediction over the examples stage's Arrow files."""
from __future__ import annotations

import time

import hydra
import lightning as L
import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Subset

from data_prep.bert_examples import BertPretrainingCollator
from data_prep.tokenizer import SPECIAL_TOKENS, load_tokenizer
from models.bert import save_encoder
from pipeline.dag import StageContext
from pipeline.data import PretrainingInstances, read_arrow
from pipeline.lit import BertPretrainModule
from pipeline.tracking import LossHistory
from pipeline.training import make_trainer


def pretrain(ctx: StageContext) -> dict:
    cfg, out = ctx.cfg, ctx.stage_dir("pretrain")
    tok = load_tokenizer(ctx.stage_dir("tokenizer"))
    vocab_size = tok.get_vocab_size()
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["config"]["vocab_size"] = -(-vocab_size // 64) * 64  # padded to a multiple of 64 for matmul tiles
    L.seed_everything(cfg.seed, workers=True)
    model = hydra.utils.instantiate(model_cfg, _convert_="all")

    dataset = PretrainingInstances([read_arrow(p) for p in sorted(ctx.stage_dir("examples").glob("*.arrow"))])
    order = np.random.default_rng(cfg.seed).permutation(len(dataset))
    n_val = max(1, int(len(dataset) * cfg.pretrain.val_fraction))
    train_set, val_set = Subset(dataset, order[n_val:].tolist()), Subset(dataset, order[:n_val].tolist())
    p = cfg.pretrain
    special_ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]

    def collator(seed: int) -> BertPretrainingCollator:
        return BertPretrainingCollator(pad_id=tok.token_to_id("[PAD]"), mask_id=tok.token_to_id("[MASK]"),
                                       vocab_size=vocab_size, special_ids=special_ids,
                                       mlm_probability=p.mlm_probability,
                                       max_predictions_per_seq=p.max_predictions_per_seq,
                                       generator=torch.Generator().manual_seed(seed))

    train_loader = DataLoader(train_set, batch_size=p.batch_size, shuffle=True, drop_last=True,
                              collate_fn=collator(cfg.seed), num_workers=p.num_workers,
                              generator=torch.Generator().manual_seed(cfg.seed))
    # Held-out batches are masked once, so every evaluation scores the same predictions.
    val_collate = collator(cfg.seed + 1)
    val_rows = [val_set[i] for i in range(len(val_set))]
    val_batches = [val_collate(val_rows[i:i + p.batch_size]) for i in range(0, len(val_rows), p.batch_size)]
    val_loader = DataLoader(val_batches, batch_size=None)

    module = BertPretrainModule(model, lr=p.lr, weight_decay=p.weight_decay, betas=p.betas,
                                warmup_steps=p.warmup_steps, max_steps=p.max_steps)
    history = LossHistory()
    trainer = make_trainer(ctx, [history], max_steps=p.max_steps, gradient_clip_val=p.grad_clip,
                       val_check_interval=min(p.val_every_steps, p.max_steps), check_val_every_n_epoch=None,
                       num_sanity_val_steps=0, enable_checkpointing=False)
    started = time.perf_counter()
    trainer.fit(module, train_loader, val_loader)
    seconds = time.perf_counter() - started
    save_encoder(model.bert, out / "encoder")
    history.write_csv(out / "loss_curve.csv")
    tokens = trainer.global_step * p.batch_size * cfg.examples.max_seq_length
    return {"steps": trainer.global_step, "train_instances": len(train_set), "val_instances": len(val_set),
            "seconds": round(seconds, 1), "padded_tokens_per_s": round(tokens / seconds, 1),
            "precision": trainer.precision, "final_val_loss": history.last("val/loss"),
            "final_val_mlm_acc": history.last("val/mlm_acc"), "final_val_nsp_acc": history.last("val/nsp_acc"),
            "num_parameters": sum(t.numel() for t in model.parameters())}
