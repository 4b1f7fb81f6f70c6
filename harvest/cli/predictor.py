"""`harvest predictor fit|eval`: fit a latency profile from profiled samples, or score one on samples."""

import argparse
import json

from base.errors import HarvestError
from predictor.partition_grid import PRESETS, PartitionGrid
from predictor.profile import Profile
from predictor.samples import Sample, load_samples


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("predictor", help="fit or evaluate the decode-latency predictor")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    fit = actions.add_parser("fit", help="fit a profile JSON from a samples CSV")
    fit.add_argument("--samples", required=True, help="CSV: infer_sm_ratio,ft_sm_ratio,batch_size,seq_len,latency_ms")
    fit.add_argument("--out", required=True, help="profile JSON to write")
    fit.add_argument("--held-out", help="samples CSV kept out of the fit; its error is recorded in the profile")
    fit.add_argument("--device", choices=sorted(PRESETS), help="SM count and granularity preset")
    fit.add_argument("--num-sms", type=int, help="SMs on the device (instead of --device)")
    fit.add_argument("--sm-granularity", type=int, help="partition granularity in SMs (with --num-sms)")
    fit.add_argument("--device-name", help="device name to record (default: the preset name)")
    fit.add_argument("--model", default="unknown", help="served model to record")
    fit.add_argument("--finetune-config-id", default="none", help="finetune config to record")

    evaluate = actions.add_parser("eval", help="print the profile's prediction error on a samples CSV as JSON")
    evaluate.add_argument("--profile", required=True)
    evaluate.add_argument("--samples", required=True)
    evaluate.add_argument("--residuals", action="store_true",
                          help="also list every sample's measured and predicted latency (look for a pattern by shape)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "fit":
        result = _fit(args)
    else:
        profile = Profile.load(args.profile)
        samples = load_samples(args.samples)
        solo, colo = profile.latency_model.score(samples)
        result = {"n": len(samples), "solo": solo.to_dict(), "colo": colo.to_dict()}
        if args.residuals:
            result["residuals"] = [_residual(profile, s) for s in samples]
    print(json.dumps(result))
    return 0


def _residual(profile: Profile, s: Sample) -> dict:
    predicted_ms = profile.latency_model.predict_sample_ms(s)
    return {"infer_sm_ratio": s.infer_sm_ratio, "ft_sm_ratio": s.ft_sm_ratio, "batch_size": s.batch_size,
            "seq_len": round(s.seq_len, 1), "measured_ms": round(s.latency_ms, 3), "predicted_ms": round(predicted_ms, 3),
            "error_pct": round((predicted_ms - s.latency_ms) / s.latency_ms * 100, 2)}


def _fit(args: argparse.Namespace) -> dict:
    samples = load_samples(args.samples)
    grid = _grid(args, samples)
    profile = Profile.build(
        samples,
        grid,
        device_name=args.device_name or args.device or f"{grid.num_sms} SMs",
        model=args.model,
        finetune_config_id=args.finetune_config_id,
        samples_path=args.samples,
        held_out=load_samples(args.held_out) if args.held_out else None,
    )
    profile.save(args.out)
    model = profile.latency_model
    return {
        "profile": args.out,
        "num_partitions": len(profile.partitions),
        "plateau_batch_size": model.solo.plateau_batch_size,
        "colo_form": None if model.colo is None else model.colo.form,
        "fit_metrics": profile.to_dict()["fit_metrics"],
    }


def _grid(args: argparse.Namespace, samples: list[Sample]) -> PartitionGrid:
    if args.device and (args.num_sms or args.sm_granularity):
        raise HarvestError("give either --device or --num-sms/--sm-granularity, not both")
    if args.device:
        return PartitionGrid.from_name(args.device)
    if args.num_sms:
        return PartitionGrid(args.num_sms, args.sm_granularity or 1)
    if all(s.infer_sm_ratio == 1.0 and s.is_solo for s in samples):
        return PartitionGrid.from_name("cpu")
    raise HarvestError("samples span several SM partitions: pass --device or --num-sms and --sm-granularity")
