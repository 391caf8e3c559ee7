// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-user-crypto`: see the library docs and README.

use clap::Parser;
use vhost_user_crypto::{args::Args, daemon};

fn main() {
    daemon::init_logging();
    let config = Args::parse().into();
    if let Err(e) = daemon::run(&config) {
        eprintln!("vhost-user-crypto: {e}");
        std::process::exit(1);
    }
}
