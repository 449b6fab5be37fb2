//! `strata fetch [NAME] [--list]`: the models Strata fetches by itself (see `crate::fetch`).

use anyhow::{Result, bail};
use clap::Args;

use crate::fetch::{self, DEFAULT_MODEL, KNOWN_MODELS};

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// Model name (see --list; default: the default chat model). The verified file's path is
    /// printed on stdout, so scripts can use `$(strata fetch NAME)`.
    pub name: Option<String>,
    /// List the known models, their size and whether they are cached.
    #[arg(long)]
    pub list: bool,
}

pub fn run(a: &FetchArgs) -> Result<()> {
    if a.list {
        println!("{:<20} {:>7}  {:<8} about", "name", "MB", "cached");
        for m in KNOWN_MODELS {
            let cached = if m.cached_path().is_file() { "yes" } else { "no" };
            let default = if m.name == DEFAULT_MODEL.name { " [default]" } else { "" };
            println!("{:<20} {:>7.0}  {:<8} {}{default}", m.name, m.bytes as f64 / 1e6, cached, m.about);
        }
        println!("cache: {}", fetch::model_dir().display());
        return Ok(());
    }
    let m = match &a.name {
        None => DEFAULT_MODEL,
        Some(n) => match fetch::find(n) {
            Some(m) => m,
            None => {
                let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
                bail!("unknown model {n:?}: known models are {}", names.join(", "))
            }
        },
    };
    println!("{}", fetch::ensure(m, true)?.display());
    Ok(())
}
