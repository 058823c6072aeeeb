//! cortex's CPU kernels (`native/`, built by `build.rs`): a ggml backend
//! registered beside llama.cpp's CPU backend that stores 4- to 8-bit
//! weights (Q4_0, Q4_1 as Q4_1; Q4_K as its own; Q5_1, Q5_K as Q5_1;
//! Q8_0; Q5_0 as Q5_1 for the AVX2 kernels and as Q8_0 for the VNNI ones;
//! Q6_K as its own quants in planes) packed
//! in panels of 16 rows and runs their matrix products, and
//! attention over an F16 KV cache (see `native/backend.c` for
//! how ggml hands them over).

use std::ffi::{CStr, c_char, c_int, c_longlong, c_void};

use llama_cpp_sys_2 as ffi;

unsafe extern "C" {
    fn cortex_kernels_register(ceiling: c_int) -> c_int;
    #[cfg_attr(not(test), allow(dead_code))]
    fn cortex_kernels_detect_isa() -> c_int;
    #[cfg_attr(not(test), allow(dead_code))]
    fn cortex_kernels_isa_supported(isa: c_int) -> c_int;
    fn cortex_kernels_set_threadpool(pool: *mut c_void);
    fn cortex_kernels_set_prefix_shares(source: *const i32, cells: *const i32, streams: i32);
    fn cortex_kernels_attention_group_items() -> c_longlong;
    fn cortex_kernels_multiplies(ggml_type: c_int, rows: c_longlong, cols: c_longlong) -> c_int;
    fn cortex_kernels_place_weights(place: c_int);
    fn cortex_kernels_self_check(isa: c_int, why: *mut c_char, why_len: usize) -> c_int;
    fn cortex_kernels_int8_per_second(isa: c_int, seconds: f64) -> f64;
    #[cfg_attr(not(test), allow(dead_code))]
    fn cortex_kernels_attention_self_check(
        isa: c_int,
        against: c_int,
        why: *mut c_char,
        why_len: usize,
    ) -> c_int;
}

/// The instruction sets the kernels are built for (`enum ck_isa`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum KernelIsa {
    Avx2 = 1,
    /// AVX2 with AVX-VNNI (256-bit `vpdpbusd`), without AVX-512.
    AvxVnni = 2,
    Avx512 = 3,
}

impl KernelIsa {
    /// Every one, lowest first.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const ALL: [KernelIsa; 3] = [Self::Avx2, Self::AvxVnni, Self::Avx512];

    fn from_raw(raw: c_int) -> Option<Self> {
        match raw {
            1 => Some(Self::Avx2),
            2 => Some(Self::AvxVnni),
            3 => Some(Self::Avx512),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Avx2 => "AVX2",
            Self::AvxVnni => "AVX-VNNI",
            Self::Avx512 => "AVX-512 VNNI",
        }
    }

    /// The one named `name` (as [`KernelIsa::name`] gives it).
    pub(crate) fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|isa| isa.name() == name)
    }

    /// Whether this CPU runs it (an AVX-512 CPU may lack AVX-VNNI).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn supported(self) -> bool {
        // SAFETY: reads the CPU's features.
        unsafe { cortex_kernels_isa_supported(self as c_int) != 0 }
    }

    /// This CPU's best, if it runs any.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn detect() -> Option<Self> {
        // SAFETY: reads the CPU's features.
        Self::from_raw(unsafe { cortex_kernels_detect_isa() })
    }
}

/// Registers the kernels with ggml (once per process; later calls return
/// the first answer): the instruction set they run with (this CPU's best,
/// or its best no better than `ceiling`), or `None` on a CPU without one,
/// where nothing is registered.
pub(crate) fn register(ceiling: Option<KernelIsa>) -> Option<KernelIsa> {
    let ceiling = ceiling.map_or(0, |isa| isa as c_int);
    // SAFETY: registration runs once under the kernels' own lock; ggml's
    // registry keeps the backend for the life of the process.
    KernelIsa::from_raw(unsafe { cortex_kernels_register(ceiling) })
}

/// The ggml threadpool the calling thread's next decodes run on: the
/// kernels run their work on the same threads as llama.cpp's CPU backend.
pub(crate) fn set_threadpool(pool: *mut ffi::ggml_threadpool) {
    // SAFETY: stores a pointer in a thread-local; the pool outlives the
    // decodes it is used for (the context that owns it frees it last).
    unsafe { cortex_kernels_set_threadpool(pool.cast()) }
}

/// The prefix shares of the streams the calling thread's next decodes
/// compute: stream `s` holds a copy of stream `source[s]`'s first
/// `cells[s]` cells (`source[s]` < 0: none). Empty slices clear them. The
/// slices must outlive those decodes: the context that owns them sets them
/// before each decode and clears them after.
pub(crate) fn set_prefix_shares(source: &[i32], cells: &[i32]) {
    let streams = i32::try_from(source.len().min(cells.len())).unwrap_or(0);
    // SAFETY: stores the pointers in a thread-local, read only during the
    // decodes they are set for, while the slices live.
    unsafe { cortex_kernels_set_prefix_shares(source.as_ptr(), cells.as_ptr(), streams) }
}

/// Work items of the attention kernel that read a shared prefix once for
/// several sequences, so far in this process.
pub(crate) fn attention_group_items() -> u64 {
    // SAFETY: reads an atomic counter.
    u64::try_from(unsafe { cortex_kernels_attention_group_items() }).unwrap_or(0)
}

/// Whether the kernels multiply a weight matrix of `ggml_type` with `rows`
/// rows of `columns` elements (else llama.cpp's CPU backend does).
pub(crate) fn multiplies(ggml_type: u32, rows: u64, columns: u64) -> bool {
    let (Ok(ggml_type), Ok(rows), Ok(columns)) = (
        c_int::try_from(ggml_type),
        c_longlong::try_from(rows),
        c_longlong::try_from(columns),
    ) else {
        return false;
    };
    // SAFETY: a pure function of its arguments.
    unsafe { cortex_kernels_multiplies(ggml_type, rows, columns) != 0 }
}

/// Whether models loaded on this thread from now on keep their Q4_1 and
/// Q8_0 weights with the kernels (else llama.cpp's CPU backend has them).
pub(crate) fn place_weights(place: bool) {
    // SAFETY: sets a thread-local flag.
    unsafe { cortex_kernels_place_weights(c_int::from(place)) }
}

/// Multiply-adds a second of `isa`'s int8 instruction (`vpdpbusd` zmm or
/// ymm, `vpmaddubsw` ymm: what its matrix tiles are built on) run back to
/// back on the calling thread for about `seconds`; 0 where this CPU does
/// not run `isa`.
pub(crate) fn int8_per_second(isa: KernelIsa, seconds: f64) -> f64 {
    // SAFETY: arithmetic in registers and reads of the clock.
    unsafe { cortex_kernels_int8_per_second(isa as c_int, seconds) }
}

/// Runs the matrix kernels of `isa` against their scalar reference on
/// random matrices of both formats at many batch sizes; every element must
/// agree bit for bit.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn self_check(isa: KernelIsa) -> Result<(), String> {
    let mut why = [0 as c_char; 512];
    // SAFETY: `why` is writable for its length; the check allocates and
    // frees its own matrices.
    let mismatches =
        unsafe { cortex_kernels_self_check(isa as c_int, why.as_mut_ptr(), why.len()) };
    failures(mismatches, &why)
}

/// Runs the attention kernel of `isa` against its reference on several
/// shapes, the same sequence at two places in the cache bit for bit, and
/// (with `against`) another instruction set's kernel bit for bit.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn attention_self_check(
    isa: KernelIsa,
    against: Option<KernelIsa>,
) -> Result<(), String> {
    let mut why = [0 as c_char; 512];
    let against = against.map_or(0, |isa| isa as c_int);
    // SAFETY: as above.
    let failed = unsafe {
        cortex_kernels_attention_self_check(isa as c_int, against, why.as_mut_ptr(), why.len())
    };
    failures(failed, &why)
}

#[cfg_attr(not(test), allow(dead_code))]
fn failures(count: c_int, why: &[c_char]) -> Result<(), String> {
    if count == 0 {
        return Ok(());
    }
    // SAFETY: the checks write a NUL-terminated message within `why`.
    let why = unsafe { CStr::from_ptr(why.as_ptr()) }.to_string_lossy();
    Err(format!("{count} failures; the first: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names `fn NAME(` declares in `text`'s `unsafe extern "C"` block
    /// (Rust) or as prototypes of `cortex_kernels_` functions (C).
    fn entry_points(text: &str, rust: bool) -> Vec<String> {
        let body = if rust {
            let start = text.find("unsafe extern \"C\" {").unwrap();
            &text[start..start + text[start..].find("\n}").unwrap()]
        } else {
            text
        };
        let mut names: Vec<String> = body
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .filter_map(|line| {
                let at = line.find("cortex_kernels_")?;
                let name: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                line[at + name.len()..].starts_with('(').then_some(name)
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_rust_declarations_are_the_c_headers() {
        let header = include_str!("../../native/cortex_kernels.h");
        let rust = include_str!("kernels.rs");
        assert_eq!(entry_points(rust, true), entry_points(header, false));
        assert_eq!(entry_points(header, false).len(), 11);
        // `enum ck_isa` in kernels.h has KernelIsa's values.
        let kernels_h = include_str!("../../native/kernels.h");
        for (c_name, isa) in [
            ("CK_ISA_AVX2", KernelIsa::Avx2),
            ("CK_ISA_AVX_VNNI", KernelIsa::AvxVnni),
            ("CK_ISA_AVX512", KernelIsa::Avx512),
        ] {
            let line = kernels_h
                .lines()
                .find(|line| line.trim_start().starts_with(&format!("{c_name} =")))
                .unwrap_or_else(|| panic!("{c_name} is not in kernels.h"));
            let value: i32 = line
                .split('=')
                .nth(1)
                .and_then(|v| {
                    let v = v.trim_start();
                    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
                    v[..digits].parse().ok()
                })
                .unwrap_or_else(|| panic!("{c_name}'s value in {line:?}"));
            assert_eq!(value, isa as i32, "{c_name}");
            assert_eq!(KernelIsa::from_raw(value), Some(isa));
        }
    }

    #[test]
    fn every_kernel_this_cpu_runs_agrees_with_the_scalar_reference() {
        let Some(best) = KernelIsa::detect() else {
            eprintln!("this CPU runs none of the kernels");
            return;
        };
        for isa in KernelIsa::ALL {
            if isa.supported() {
                self_check(isa).unwrap_or_else(|why| panic!("{}: {why}", isa.name()));
            } else {
                eprintln!("this CPU does not run the {} kernels", isa.name());
            }
        }
        assert!(best.supported());
    }

    #[test]
    fn the_int8_peak_is_measured_for_every_instruction_set_this_cpu_runs() {
        for isa in KernelIsa::ALL {
            let rate = int8_per_second(isa, 0.01);
            if isa.supported() {
                // Any core of these instruction sets does billions a second.
                assert!(rate.is_finite() && rate > 1e9, "{}: {rate}", isa.name());
            } else {
                assert_eq!(rate, 0.0, "{}", isa.name());
            }
        }
    }

    #[test]
    fn attention_agrees_with_its_reference_wherever_a_sequence_lies_and_alike_on_every_isa() {
        if KernelIsa::detect().is_none() {
            eprintln!("this CPU runs none of the kernels");
            return;
        }
        attention_self_check(KernelIsa::Avx2, None).unwrap_or_else(|why| panic!("AVX2: {why}"));
        for isa in [KernelIsa::AvxVnni, KernelIsa::Avx512] {
            if isa.supported() {
                attention_self_check(isa, Some(KernelIsa::Avx2))
                    .unwrap_or_else(|why| panic!("{}: {why}", isa.name()));
            }
        }
    }
}
