//! h2 as this crate builds it (Cargo.toml's `[patch.crates-io]`: patches/apply.py lays out h2 with
//! patches/h2-window-update-after-goaway.patch): a WINDOW_UPDATE on a stream above the final GOAWAY's last
//! stream id is ignored, so the connection's open streams are still answered.

#[path = "support/goaway_race.rs"]
mod goaway_race;

#[tokio::test]
async fn a_window_update_above_the_goaway_does_not_fail_the_connection() {
    let outcome = goaway_race::run().await;
    assert!(!outcome.protocol_error, "{outcome:?}");
    assert!(outcome.answered, "{outcome:?}");
    assert_eq!(outcome.goaways.last().copied(), Some((1, 0)), "{outcome:?}");
}
