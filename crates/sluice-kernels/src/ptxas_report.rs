//! What `ptxas -v` says about each kernel of a PTX file: registers, stack and spills. The build
//! script compiles this same file (`#[path]`) to check our CUDA kernels at every build with the
//! `cuda` feature, so the parser is unit-tested without a toolkit.

/// Resources of one kernel as ptxas reports them for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub stack_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory (`smem`), 0 when ptxas does not print it.
    pub shared_bytes: u32,
}

impl KernelResources {
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }

    /// One line of the report the build writes (`ptxas-report.txt`).
    pub fn line(&self) -> String {
        format!(
            "{}: {} registers, {} bytes smem, {} bytes stack, {} bytes spill stores, {} bytes spill loads",
            self.name,
            self.registers,
            self.shared_bytes,
            self.stack_bytes,
            self.spill_store_bytes,
            self.spill_load_bytes
        )
    }
}

/// Parses ptxas's `-v` output (its stderr). Each kernel starts at `Compiling entry function
/// 'NAME'`; the lines after it give its stack/spills and registers. Lines about other things
/// (global properties, `Function properties for` device functions) are skipped.
pub fn parse(ptxas_output: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    for line in ptxas_output.lines() {
        if let Some(name) = quoted_after(line, "Compiling entry function '") {
            kernels.push(KernelResources {
                name: name.to_string(),
                registers: 0,
                stack_bytes: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                shared_bytes: 0,
            });
            continue;
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        if line.contains("bytes spill stores") {
            k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains(" registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    kernels
}

fn quoted_after<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    Some(&rest[..rest.find('\'')?])
}

/// The integer just before `unit` in `line` ("..., 40 registers" -> 40).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let head = line[..line.find(unit)?].trim_end();
    let start = head
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    head[start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape of ptxas 13.0's `-v` output (one kernel spilling, one not).
    const SAMPLE: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'write_kv_f32_f16' for 'sm_90a'
ptxas info    : Function properties for write_kv_f32_f16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 0 barriers, 416 bytes cmem[0]
ptxas info    : Compiling entry function 'paged_attention_f32_f16_d128' for 'sm_90a'
ptxas info    : Function properties for paged_attention_f32_f16_d128
    8 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 24640 bytes smem, 440 bytes cmem[0]
";

    #[test]
    fn reads_registers_and_spills_per_kernel() {
        let k = parse(SAMPLE);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "write_kv_f32_f16");
        assert_eq!((k[0].registers, k[0].shared_bytes), (18, 0));
        assert!(!k[0].spills());
        assert_eq!(k[1].name, "paged_attention_f32_f16_d128");
        assert_eq!(
            (k[1].registers, k[1].stack_bytes, k[1].shared_bytes),
            (128, 8, 24640)
        );
        assert_eq!((k[1].spill_store_bytes, k[1].spill_load_bytes), (12, 12));
        assert!(k[1].spills());
        assert!(k[1].line().contains("12 bytes spill stores"));
    }

    #[test]
    fn ignores_lines_before_the_first_kernel() {
        assert!(parse("ptxas info    : 0 bytes gmem\n").is_empty());
    }
}
