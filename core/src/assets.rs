//! Files both planes ship inside their binaries, kept in one place (`core/assets/`).

/// The font of every plot murmur draws (`murmur run --output`, `murmur-trainer simulate`):
/// DejaVu Sans, embedded so plots look the same on any machine (licence in
/// `core/assets/LICENSE-DejaVu.txt`).
pub const PLOT_FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
