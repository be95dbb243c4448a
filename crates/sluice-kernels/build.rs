//! With the `cuda` feature: compiles our CUDA kernels (`cuda/*.cu`) to PTX with nvcc, which
//! `src/cuda/` embeds, and checks every kernel with `ptxas -v` for the target GPU: a kernel
//! that spills registers to local memory fails the build. The report (registers, shared memory,
//! spills per kernel) is written to `$OUT_DIR/ptxas-report.txt` and embedded too.
//! Without the feature it does nothing.
//!
//! The toolkit: `scripts/setup-cuda.sh` (CUDA 13.0 from PyPI). `CUDA_COMPUTE_CAP` (default 90,
//! Hopper) picks the target: PTX for `sm_<cap>`, checked by ptxas for `sm_<cap>a` from 90 on.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/ptxas_report.rs"]
mod ptxas_report;

/// The `.cu` files, each one PTX module.
const MODULES: &[&str] = &["cache_write", "paged_attention", "fused", "sampling"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/ptxas_report.rs");
    println!("cargo:rerun-if-changed=cuda");
    for var in ["CUDA_COMPUTE_CAP", "CUDA_HOME", "CUDA_PATH", "NVCC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap: u32 = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .map(|c| c.trim().replace('.', ""))
        .map_or(90, |c| {
            c.parse()
                .unwrap_or_else(|_| panic!("CUDA_COMPUTE_CAP={c} is not a number like 90"))
        });
    let nvcc = tool("nvcc");
    let ptxas = tool("ptxas");
    let ptxas_arch = if cap >= 90 {
        format!("sm_{cap}a")
    } else {
        format!("sm_{cap}")
    };

    let mut report = format!("ptxas -arch={ptxas_arch} -v, per kernel\n");
    let mut spilled = Vec::new();
    for module in MODULES {
        let src = Path::new("cuda").join(format!("{module}.cu"));
        let ptx = out.join(format!("{module}.ptx"));
        run(Command::new(&nvcc)
            .args(["-ptx", "-O3", "-std=c++17", "-lineinfo"])
            .arg(format!("-arch=sm_{cap}"))
            .args(["-I", "cuda"])
            .arg(&src)
            .arg("-o")
            .arg(&ptx));
        let stderr = run(Command::new(&ptxas)
            .arg(format!("-arch={ptxas_arch}"))
            .arg("-v")
            .arg(&ptx)
            .arg("-o")
            .arg(out.join(format!("{module}.cubin"))));
        for kernel in ptxas_report::parse(&stderr) {
            report.push_str(&kernel.line());
            report.push('\n');
            if kernel.spills() {
                spilled.push(kernel.line());
            }
        }
    }
    std::fs::write(out.join("ptxas-report.txt"), &report).expect("write ptxas-report.txt");
    if !spilled.is_empty() {
        panic!(
            "CUDA kernels spill registers to local memory:\n{}",
            spilled.join("\n")
        );
    }
}

/// A toolkit binary: `$NVCC` for nvcc, else `$CUDA_HOME/bin/NAME`, else NAME on the PATH.
fn tool(name: &str) -> PathBuf {
    if name == "nvcc" {
        if let Some(p) = std::env::var_os("NVCC") {
            return p.into();
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = Path::new(&home).join("bin").join(name);
            if p.exists() {
                return p;
            }
        }
    }
    name.into()
}

/// Runs `cmd` and returns its stderr; fails the build with both streams when it fails.
fn run(cmd: &mut Command) -> String {
    let output = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} ({e}): install the toolkit with scripts/setup-cuda.sh and source its env file",
            cmd.get_program()
        )
    });
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        panic!(
            "{cmd:?} failed:\n{}\n{stderr}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
    stderr
}
