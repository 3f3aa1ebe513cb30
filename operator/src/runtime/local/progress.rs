//! What `murmur run` shows while it runs: at a terminal, a job bar and a line per member
//! (indicatif); otherwise plain log lines, a progress line every few seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use murmur_core::api::{DecentralizedTrainingJobSpec, NamedMetric};

use crate::status::JobView;

const PLAIN_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    bars: Option<Bars>,
    last_plain: Option<Instant>,
}

struct Bars {
    multi: MultiProgress,
    job: ProgressBar,
    members: BTreeMap<u32, ProgressBar>,
}

fn fmt(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "–".into(), f)
}

/// "accuracy 92.1%", "perplexity 4.213", or "accuracy –" before the first evaluation.
fn quality(p: &murmur_core::api::Progress) -> String {
    match p.quality() {
        Some(q) if q.name == NamedMetric::ACCURACY => format!("accuracy {:.1}%", 100.0 * q.value),
        Some(q) => format!("{} {:.3}", q.name, q.value),
        None => "accuracy –".into(),
    }
}

/// One line about the whole job.
pub fn job_line(view: &JobView) -> String {
    let p = view.status.progress.clone().unwrap_or_default();
    format!(
        "{:?} step {}{} · loss {} · {} · consensus {} · members {} · preemptions {}",
        view.status.phase.unwrap_or_default(),
        p.step,
        view.target_steps.map_or(String::new(), |t| format!("/{t}")),
        fmt(p.loss, |v| format!("{v:.3}")),
        quality(&p),
        fmt(p.consensus_distance, |v| format!("{v:.2e}")),
        view.status.member_summary.clone().unwrap_or_default(),
        view.status.preemptions,
    )
}

impl Progress {
    pub fn new(bars: bool, name: &str, spec: &DecentralizedTrainingJobSpec) -> Self {
        let bars = bars.then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let job = multi.add(ProgressBar::new(spec.training.steps.unwrap_or(0)));
            job.set_style(
                ProgressStyle::with_template("{prefix:.bold} [{bar:30}] {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            job.set_prefix(name.to_string());
            Bars {
                multi,
                job,
                members: BTreeMap::new(),
            }
        });
        Self {
            bars,
            last_plain: None,
        }
    }

    /// A line that stays (an event).
    pub fn line(&self, text: &str) {
        match &self.bars {
            Some(b) => {
                let _ = b.multi.println(text);
            }
            None => println!("{text}"),
        }
    }

    pub fn update(&mut self, view: &JobView) {
        let Some(b) = &mut self.bars else {
            if self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
                self.last_plain = Some(Instant::now());
                println!("{}", job_line(view));
            }
            return;
        };
        let p = view.status.progress.clone().unwrap_or_default();
        b.job.set_position(p.step);
        b.job.set_message(job_line(view));
        for m in &view.members {
            let bar = b.members.entry(m.id).or_insert_with(|| {
                let bar = b
                    .multi
                    .add(ProgressBar::new(view.target_steps.unwrap_or(0)));
                bar.set_style(
                    ProgressStyle::with_template("  member {prefix:>3} [{bar:20}] {msg}")
                        .expect("a valid template")
                        .progress_chars("=> "),
                );
                bar.set_prefix(m.id.to_string());
                bar
            });
            bar.set_position(m.progress.step);
            bar.set_message(format!(
                "{:?} (attempt {}) · step {} · loss {} · {}{}",
                m.phase,
                m.attempt,
                m.progress.step,
                fmt(m.progress.loss, |v| format!("{v:.3}")),
                quality(&m.progress),
                m.clique.map_or(String::new(), |c| format!(" · clique {c}")),
            ));
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bars {
            for bar in b.members.values() {
                bar.finish();
            }
            b.job.finish();
        }
    }
}
