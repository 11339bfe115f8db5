//! The recipe of `docs/snapshots.md`, run: a user's snapshot test of their
//! own rewrite. `Rewritten::canonical_text` gives the rewrite's canonical
//! HLO text and insta keeps it in `tests/snapshots/` (review with `cargo
//! insta review`). The docs show this file's test verbatim, and the second
//! test holds them to it.

// BEGIN recipe
#[test]
fn my_rewrite_is_its_snapshot() {
    let module = equarx::text::parse(
        "HloModule my_model, num_partitions=8

         %sum (a: bf16[], b: bf16[]) -> bf16[] {
           %a = bf16[] parameter(0)
           %b = bf16[] parameter(1)
           ROOT %add = bf16[] add(%a, %b)
         }

         ENTRY %main (x: bf16[8,128]) -> bf16[8,128] {
           %x = bf16[8,128]{1,0} parameter(0)
           ROOT %psum = bf16[8,128]{1,0} all-reduce(%x), channel_id=1,
             replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%sum
         }",
    )
    .unwrap();
    let options = equarx::options::from_json(r#"{"min_payload_bytes": 0}"#).unwrap();
    let rewritten = equarx::rewrite(module.proto, module.counts, &options).unwrap();
    insta::assert_snapshot!(rewritten.canonical_text().unwrap());
}
// END recipe

#[test]
fn the_docs_show_this_recipe() {
    let this = include_str!("user_snapshot.rs");
    let recipe = this
        .split("// BEGIN recipe\n")
        .nth(1)
        .and_then(|s| s.split("// END recipe").next())
        .expect("the recipe's markers");
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/snapshots.md"))
        .expect("docs/snapshots.md");
    assert!(
        docs.contains(recipe),
        "docs/snapshots.md must show tests/user_snapshot.rs's recipe verbatim:\n{recipe}"
    );
}
