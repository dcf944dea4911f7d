//! Side effects recorded once: an outbox unique on (owner, dedupe key), claimed and delivered by
//! workers per channel (`tide.create_effect`, `tide.claim_effects`).

::pgrx::extension_sql_file!("effects.sql", name = "effects", requires = ["execution"]);
