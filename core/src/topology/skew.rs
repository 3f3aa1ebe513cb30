//! Label skew of a group of members: how far the group's class distribution is from the global one.
//! skew(S) = sum over classes l of |p_S(l) - p(l)|, in [0, 2].

/// Normalised class distribution of a sum of histograms (uniform when empty).
pub fn distribution(counts: &[f64]) -> Vec<f64> {
    let total: f64 = counts.iter().sum();
    if total <= 0.0 {
        return vec![1.0 / counts.len().max(1) as f64; counts.len()];
    }
    counts.iter().map(|c| c / total).collect()
}

/// Skew of a group whose summed class counts are `counts`, against the global distribution.
pub fn skew(counts: &[f64], global: &[f64]) -> f64 {
    let total: f64 = counts.iter().sum();
    if total <= 0.0 {
        return global.iter().map(|p| p.abs()).sum();
    }
    counts
        .iter()
        .zip(global)
        .map(|(c, p)| (c / total - p).abs())
        .sum()
}

/// Element-wise sum of histograms.
pub fn sum<'a>(histograms: impl IntoIterator<Item = &'a [f64]>, classes: usize) -> Vec<f64> {
    let mut out = vec![0.0; classes];
    for h in histograms {
        for (o, x) in out.iter_mut().zip(h) {
            *o += x;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_groups_have_no_skew_and_single_class_groups_have_most() {
        let global = vec![0.25; 4];
        assert!(skew(&[5.0, 5.0, 5.0, 5.0], &global) < 1e-12);
        assert!((skew(&[8.0, 0.0, 0.0, 0.0], &global) - 1.5).abs() < 1e-12);
        assert_eq!(sum([&[1.0, 2.0][..], &[3.0, 4.0][..]], 2), vec![4.0, 6.0]);
        assert_eq!(distribution(&[1.0, 3.0]), vec![0.25, 0.75]);
    }
}
