//! `cortex devices`: llama.cpp's backend modules found (where, which
//! variant, what was skipped and why) and the devices they offer, with
//! their memory.

use cortex_engine::{Device, DeviceKind};
use cortex_llama::Backends;
use serde_json::{Value, json};

use crate::config::Config;
use crate::output::{out, outln};

pub(crate) fn devices(config: &Config, json: bool) -> anyhow::Result<()> {
    let (dir, cpu_kernels) = config.device_modules();
    let backends = cortex_llama::load_backends(dir.as_deref(), cpu_kernels);
    let devices = cortex_llama::devices();
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&as_json(backends, &devices))?
        )?;
        return Ok(());
    }
    out!("{}", as_text(backends, &devices))?;
    Ok(())
}

fn as_json(backends: &Backends, devices: &[Device]) -> Value {
    json!({
        "searched": backends.searched,
        "backends": backends.registered,
        "cortex_kernels": backends.cortex_kernels,
        "modules": backends.loaded.iter().map(|m| json!({
            "backend": m.backend, "path": m.path, "score": m.score,
        })).collect::<Vec<_>>(),
        "skipped": backends.skipped.iter().map(|(path, why)| json!({
            "path": path, "why": why,
        })).collect::<Vec<_>>(),
        "same_output": same_output(backends, devices),
        "devices": devices.iter().map(|d| json!({
            "name": d.name, "description": d.description, "kind": d.kind.to_string(),
            "backend": d.backend, "memory_free": d.memory_free, "memory_total": d.memory_total,
        })).collect::<Vec<_>>(),
    })
}

/// Where a line's output depends only on the line (see the command line
/// chapter, "Same input, same output"): on the CPU with cortex's kernels.
fn same_output(backends: &Backends, devices: &[Device]) -> String {
    let gpu = devices
        .iter()
        .find(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::IntegratedGpu));
    match (backends.cortex_kernels, gpu) {
        (Some(isa), None) => format!(
            "yes, on the CPU: a line's output is the same whatever runs beside it (cortex's {isa} kernels; weights in Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K or Q8_0)"
        ),
        (Some(isa), Some(gpu)) => format!(
            "on the CPU (--device cpu, cortex's {isa} kernels), not on {}: llama.cpp's GPU kernels change with the batch",
            gpu.name
        ),
        (None, _) => {
            "not promised here: llama.cpp's kernels change with the batch (cortex's need AVX2)"
                .to_owned()
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn as_text(backends: &Backends, devices: &[Device]) -> String {
    let mut out = String::from("devices:\n");
    let width = devices.iter().map(|d| d.name.len()).max().unwrap_or(0);
    for d in devices {
        // cortex's kernels are a device to ggml (so weights can be placed
        // on it) but own no memory: they work in the host's.
        let (kind, memory) = if d.memory_total == 0 {
            ("cpu kernels".to_owned(), "in host memory".to_owned())
        } else {
            (
                d.kind.to_string(),
                format!("{} free of {}", mib(d.memory_free), mib(d.memory_total)),
            )
        };
        out.push_str(&format!(
            "  {:<width$}  {kind:<14}  {memory}  {}\n",
            d.name, d.description
        ));
    }
    out.push_str(&format!("backends: {}\n", backends.registered.join(", ")));
    for module in &backends.loaded {
        let score = module
            .score
            .map_or_else(String::new, |s| format!(" (score {s})"));
        out.push_str(&format!(
            "  {} from {}{score}\n",
            module.backend,
            module.path.display()
        ));
    }
    if backends.loaded.is_empty() {
        out.push_str("  built into the program (no backend modules found)\n");
    }
    out.push_str(&match backends.cortex_kernels {
        Some(isa) => format!(
            "cortex kernels: {isa} (they multiply Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 weights on the CPU; --cpu-kernels llama leaves them to llama.cpp)\n"
        ),
        None => "cortex kernels: none for this CPU (llama.cpp multiplies every weight)\n".to_owned(),
    });
    out.push_str(&format!(
        "same input, same output: {}\n",
        same_output(backends, devices)
    ));
    out.push_str("searched for modules, in order:\n");
    for dir in &backends.searched {
        out.push_str(&format!("  {}\n", dir.display()));
    }
    // Files not loaded, grouped by why.
    let mut why_not: Vec<(&str, Vec<String>)> = Vec::new();
    for (path, why) in &backends.skipped {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        match why_not.iter_mut().find(|(w, _)| w == why) {
            Some((_, names)) => names.push(name),
            None => why_not.push((why, vec![name])),
        }
    }
    if !why_not.is_empty() {
        out.push_str("not loaded:\n");
        for (why, names) in why_not {
            out.push_str(&format!("  {why}: {}\n", names.join(", ")));
        }
    }
    out
}
