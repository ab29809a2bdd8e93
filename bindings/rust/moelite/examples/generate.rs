//! Generates a continuation of a prompt: the Rust quick start of the README.
//!
//!     cargo run --example generate -- MODEL [PROMPT] [BUDGET]
//!
//! BUDGET is spelled as everywhere in moelite ("25%", "2GiB", "auto"); without it every expert is
//! resident.
use moelite::{Budget, Context, ContextParams, GenerateParams, Model, ModelParams};

fn main() -> Result<(), moelite::Error> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 2 {
        eprintln!("usage: {} MODEL [PROMPT] [BUDGET]", args[0]);
        std::process::exit(2);
    }
    let prompt = args.get(2).map(String::as_str).unwrap_or("def fibonacci(n):");
    let mut params = ModelParams::new();
    if let Some(budget) = args.get(3) {
        params = params.budget(Budget::Text(budget.clone()));
    }
    let model = Model::load(&args[1], &params)?;
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(256))?;
    let tokens = model.tokenize(prompt, true, false)?;
    print!("{prompt}");
    for token in ctx.generate(&tokens, &GenerateParams::new().max_tokens(32).temperature(0.0))? {
        print!("{}", token?.text);
    }
    println!("\n(expert hit rate {:.2})", ctx.expert_stats(None)?.hit_rate());
    Ok(())
}
