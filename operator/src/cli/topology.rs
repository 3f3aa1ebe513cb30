use clap::Args;

#[derive(Args, Debug)]
pub struct TopologyArgs {}

#[derive(Debug, thiserror::Error)]
pub enum TopologyCliError {}

pub fn run(_args: TopologyArgs, _out: &mut impl std::io::Write) -> Result<(), super::CliError> {
    Ok(())
}
