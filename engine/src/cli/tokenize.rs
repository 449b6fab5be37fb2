//! `strata tokenize`: text → token ids (JSON array on stdout).

use anyhow::Result;
use clap::Args;

use crate::engine::Engine;

#[derive(Args, Debug, Clone)]
pub struct TokenizeArgs {
    /// Text to tokenize.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Do not add BOS even if the model asks for it.
    #[arg(long)]
    pub no_bos: bool,
    /// Parse special-token text such as `<start_of_turn>` into their ids.
    #[arg(long)]
    pub special: bool,
    /// Print one `id<TAB>piece` line per token instead of the JSON array.
    #[arg(long)]
    pub pieces: bool,
}

pub fn run(e: &Engine, a: &TokenizeArgs) -> Result<()> {
    let ids = e.tokenizer.encode(&a.prompt, e.tokenizer.add_bos() && !a.no_bos, a.special);
    if a.pieces {
        for id in &ids {
            println!("{id}\t{:?}", String::from_utf8_lossy(&e.tokenizer.token_to_bytes(*id)));
        }
    } else {
        println!("{}", serde_json::to_string(&ids)?);
    }
    Ok(())
}
