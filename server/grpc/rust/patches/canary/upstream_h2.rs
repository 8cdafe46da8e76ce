//! Fails when upstream h2 has fixed the bug patches/h2-window-update-after-goaway.patch fixes (see Cargo.toml).

#[path = "../../tests/support/goaway_race.rs"]
mod goaway_race;

#[tokio::test]
async fn upstream_h2_still_fails_the_connection_on_a_window_update_above_the_goaway() {
    let outcome = goaway_race::run().await;
    assert!(
        outcome.protocol_error && !outcome.answered,
        "the newest h2 on crates.io ignores a WINDOW_UPDATE above the final GOAWAY's last stream id now \
         ({outcome:?}): move server/grpc/rust/Cargo.lock to that release and drop \
         patches/h2-window-update-after-goaway.patch (patches/README.md)"
    );
}
