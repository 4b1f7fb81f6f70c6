"""Trace replay (issue 7): simulated per co-location policy, or live against a running `harvest serve`.

`harvest replay ... --out DIR` writes DIR/results.json (schema_version 1):

- mode: "simulated" | "live"; created_utc; wall_s; trace: {name, num_requests, duration_s, rate_per_s,
  context/generated token p50/p99, num_generated_tokens, spec, window, window_start, rate_scale, caps}
- config: {tpot_slo_ms, ...}; notes: [str] (a SYNTHETIC profile is said here, and in profile.is_synthetic)
- simulated only: profile: {path, device, is_synthetic, created_utc, model, num_sms, num_partitions,
  has_co_run_model, whole_device_finetune_tokens_per_s}; memory: {preset, kv_capacity_tokens, ...};
  fleet: how the policies' devices are counted; simulation_s: {total, <policy>: s}
- live only: target, admin, replay_s
- policies: {name: entry}, name in separate/static/harvest/temporal/oracle (simulated; oracle only with
  --with-oracle) or live. An entry is
  {status: "not_applicable", reason} or {status: "ok", num_decode_devices, has_finetune_device,
   decode: {num_steps, num_requests, num_tokens, step_slo_attainment (fraction of decode steps within
     the target, each charged with its slice and any wait for an idle-time unit), step_latency_ms_p50/p90/p99/max, tpot_ms_p50/p90/p99 (per request),
     request_tpot_slo_attainment, queue_delay_s_p50/p99, mean_batch_size, makespan_s},
   finetune: {tokens_per_s and samples_per_s (whole fleet; samples/s from optimizer steps x samples per
     step, null where the profile measured none), decode_device_tokens_per_s (harvested on a decode
     device), finetune_device_tokens_per_s, ratio_to_separate, ratio_to_static,
     decode_device_ratio_to_oracle (with --with-oracle)},
   co_run_step_fraction, tpot_cdf_ms and step_latency_cdf_ms (201 quantiles, 0 to 1),
   series: {t_s, step_latency_ms, step_latency_ms_max, batch_size, and (simulated) infer_sms, ft_sms,
     kv_bytes, lent_bytes (memory the finetune job holds: lent from the KV pool), window_layers, or
     (live) kv_tokens; per-bin means, null where the device was idle}}
"""

from harvest.replay.live_replay import LiveReplay
from harvest.replay.replay_simulation import ReplaySimulation

__all__ = ["LiveReplay", "ReplaySimulation"]
