"""Per-device autotuning with MetaSchedule: workloads, device keys, the tune driver, apply at load."""
