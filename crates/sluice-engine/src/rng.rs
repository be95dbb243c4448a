//! The per-sequence random number generator of the sampler. Each sequence owns one, so what a
//! seeded request draws never depends on which other requests share its steps.
//!
//! xoshiro256++ seeded through SplitMix64: tiny (`Copy`, 32 bytes, so the sampler can carry it
//! by value across threads), fast, and defined here, so a seed gives the same text on every
//! platform and with every version of the `rand` crate.

/// xoshiro256++ state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SeqRng {
    /// The generator of sequence `index` of a request seeded with `seed`: the sequences of an
    /// `n > 1` request draw different streams, each reproducible.
    pub fn new(seed: u64, index: u32) -> Self {
        let mut state = seed ^ u64::from(index).wrapping_mul(0xD1B5_4A32_D192_ED03);
        let s = [
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
        ];
        Self { s }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// The generator after `draws` more draws.
    pub fn advanced(mut self, draws: usize) -> Self {
        for _ in 0..draws {
            self.next_u64();
        }
        self
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_indices_differ() {
        let mut a = SeqRng::new(42, 0);
        let mut b = SeqRng::new(42, 0);
        let mut c = SeqRng::new(42, 1);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn uniform_draws_cover_the_unit_interval() {
        let mut r = SeqRng::new(7, 0);
        let mut buckets = [0u32; 10];
        for _ in 0..100_000 {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        for b in buckets {
            assert!((9_000..11_000).contains(&b), "{buckets:?}");
        }
    }
}
