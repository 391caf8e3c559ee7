// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-user-crypto`: see the library docs and README.

use clap::Parser;
use vhost_user_crypto::{args, args::Args, daemon, memory_check::helper};

fn main() {
    // The daemon runs its memory checks in a process of this binary.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == helper::MEMORY_CHECK_HELPER_ARG)
    {
        let rest: Vec<String> = std::env::args_os()
            .skip(2)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        std::process::exit(helper::memory_check_helper_main(&rest));
    }
    if args::wants_capabilities(std::env::args_os()) {
        println!("{}", args::CAPABILITIES);
        return;
    }
    daemon::init_logging();
    let config = Args::parse().into();
    if let Err(e) = daemon::run(&config) {
        eprintln!("vhost-user-crypto: {e}");
        std::process::exit(1);
    }
}
