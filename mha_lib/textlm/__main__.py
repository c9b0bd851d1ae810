"""``python -m mha_lib.textlm train``: train chapter 09's language model on the CPU, with a progress bar.

``python -m mha_lib.textlm sample``: continue a prompt with the shipped model (or ``--model FILE``).
``python -m mha_lib.textlm study``: train it from several seeds and measure every run's heads
(the study chapter 09 quotes; ``make study`` rewrites the shipped one).
``python -m mha_lib.textlm configurations``: one run of each configuration tried next to the
shipped one (chapter 09's table of them).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence

import torch

from ..bench.cli import positive_int
from ..device import seed_everything
from ..studies import add_study_arguments
from .checkpoint import load_checkpoint, save_checkpoint
from .config import MODEL, TRAIN
from .corpus import load_corpus
from .model import ModelConfig, TextTransformer
from .train import TrainConfig, train_lm


def _train(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    from .study import VAL_WINDOWS

    corpus = load_corpus()
    seed_everything(args.seed)  # the initialisation; the data order is seed 1000 + seed, as in the study
    config = ModelConfig(vocab_size=len(corpus.tokenizer), **{**MODEL, "mlp": not args.no_mlp})
    model = TextTransformer(config).to(args.device)
    train = TrainConfig(**{**TRAIN, "steps": args.steps, "seed": 1000 + args.seed})
    inputs, targets = corpus.val_windows(VAL_WINDOWS, config.max_len)
    print(f"training {sum(p.numel() for p in model.parameters()):,} weights for {train.steps} steps "
          f"on {corpus.train.numel():,} tokens ({args.device}, {torch.get_num_threads()} threads)", file=sys.stderr)
    history = train_lm(model, corpus.train, inputs, targets, train)
    path = save_checkpoint(args.output, model, corpus.tokenizer, train, history)
    print(f"held-out loss {history['val_loss'][-1]:.3f} nats per token after {history['seconds']:.0f} s; saved {path}")
    return 0


def _sample(args: argparse.Namespace) -> int:
    model, tokenizer, _ = load_checkpoint(args.model)
    ids = torch.tensor([tokenizer.encode(args.prompt)])
    out = model.generate(ids, args.tokens, temperature=args.temperature, generator=torch.Generator().manual_seed(args.seed))
    print(tokenizer.decode(out[0]))
    return 0


def _study(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .study import run_study, save_study

    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    seeds = args.seeds if args.seeds is not None else list(range(6))
    started = time.perf_counter()
    runs = run_study(seeds, workers=args.workers, device=args.device, checkpoint=args.checkpoint,
                     checkpoint_dir=args.checkpoint_dir)
    seconds = round(time.perf_counter() - started, 1)
    path = save_study(runs, args.output, command="python -m mha_lib.textlm " + shlex.join(argv), seconds=seconds)
    print(f"{len(runs)} runs in {seconds:.0f} s; wrote {path}")
    return 0


def _configurations(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .configurations import CONFIGURATIONS_FILE, run_configurations, save_configurations

    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")
    started = time.perf_counter()
    try:
        runs = run_configurations(args.only, workers=args.workers, device=args.device)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    seconds = round(time.perf_counter() - started, 1)
    path = save_configurations(runs, args.output or CONFIGURATIONS_FILE,
                               command="python -m mha_lib.textlm " + shlex.join(argv), seconds=seconds)
    print(f"{len(runs)} runs in {seconds:.0f} s; wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha_lib.textlm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a model from scratch and save it")
    train.add_argument("--steps", type=positive_int, default=TRAIN["steps"], help=f"default {TRAIN['steps']}")
    train.add_argument("--seed", type=int, default=0, help="the run's seed: its initialisation and data order")
    train.add_argument("--output", default="textlm.pt", help="where to save the model (default textlm.pt)")
    train.add_argument("--threads", type=positive_int, help="CPU threads (default: PyTorch's)")
    train.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    train.add_argument("--no-mlp", action="store_true", help="attention only, no MLP in the blocks")
    sample = sub.add_parser("sample", help="continue a prompt")
    sample.add_argument("prompt", nargs="?", default="    def test_")
    sample.add_argument("--tokens", type=positive_int, default=80)
    sample.add_argument("--temperature", type=float, default=0.8)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--model", default=None, help="a checkpoint (default: the shipped one)")
    study = sub.add_parser("study", help="train from several seeds (default 0-5) and measure every run's heads")
    add_study_arguments(study, output="textlm_study.json")
    study.add_argument("--checkpoint", default=None,
                       help="also save the first seed's model there (make study: the shipped model)")
    study.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                       help="also save every run's model in DIR, as model_seed<N>.pt")
    configurations = sub.add_parser("configurations",
                                    help="one run (seed 0) of each configuration tried next to the shipped one")
    configurations.add_argument("--only", nargs="+", default=None, metavar="NAME",
                                help="these configurations only (default: all)")
    configurations.add_argument("--workers", type=int, default=2, help="runs side by side (default 2)")
    configurations.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    configurations.add_argument("--output", default=None, help="default: mha_lib/textlm/configurations.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "study":
        return _study(args, argv)
    if args.command == "configurations":
        return _configurations(args, argv)
    return _train(args) if args.command == "train" else _sample(args)


if __name__ == "__main__":
    sys.exit(main())
