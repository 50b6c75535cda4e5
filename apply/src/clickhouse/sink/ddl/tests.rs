use super::*;
use sluice_proto::v1::ColumnType;

fn col(name: &str, t: ColumnType, sql: &str) -> Column {
    Column {
        name: name.into(),
        r#type: t as i32,
        sql_type: sql.into(),
        ..Default::default()
    }
}

fn schema(columns: Vec<Column>) -> TableSchema {
    TableSchema {
        columns,
        ..Default::default()
    }
}

fn changes(
    columns: &BTreeMap<String, ChType>,
    before: &[Column],
    new: &TableSchema,
    statement: &str,
    features: Features,
    create: bool,
) -> Result<ColumnChanges, String> {
    column_changes(
        columns,
        &Before {
            columns: before,
            exact: true,
        },
        new,
        &[statement.to_string()],
        features,
        create,
    )
}

#[test]
fn a_modify_read_again_after_a_restart_widens_the_target_whatever_later_schemas_say() {
    let f = Features::of_version("18.16.1");
    let id = col("id", ColumnType::Int, "int(11)");
    let a = Column {
        nullable: true,
        ..col("a", ColumnType::Int, "int(11)")
    };
    let big = Column {
        nullable: true,
        ..col("a", ColumnType::Bigint, "bigint(20)")
    };
    let target: BTreeMap<String, ChType> = [
        ("id".to_string(), map_column(&id, f)),
        ("a".to_string(), map_column(&a, f)),
    ]
    .into();
    let after = schema(vec![id.clone(), big.clone()]);
    let modify = "ALTER TABLE t MODIFY COLUMN `a` BIGINT NULL";
    let run = |columns: &[Column], exact: bool, statement: &str, create: bool| {
        column_changes(
            &target,
            &Before { columns, exact },
            &after,
            &[statement.to_string()],
            f,
            create,
        )
    };
    // After a restart the schema topic holds the table's schemas before and after the
    // statement (a capture read it again and registered the same schema once more): the
    // later definition of `a` is among them, and the target must still be widened.
    let guess = vec![id.clone(), a.clone(), id.clone(), big.clone()];
    let change = run(&guess, false, modify, true).unwrap();
    assert_eq!(change.widened, vec![("a".to_string(), map_column(&big, f))]);
    // With tables.create off the row is refused, not written into a column too narrow.
    let refused = run(&guess, false, modify, false).unwrap_err();
    assert!(refused.contains("column a is now bigint(20)"), "{refused}");
    // The schema before the statement known exactly, and `a` already BIGINT in it (a
    // target mapped by hand): left as it is.
    assert!(run(&[id.clone(), big.clone()], true, modify, true)
        .unwrap()
        .widened
        .is_empty());
    // A guess, and a statement that does not redefine `a`: the earlier rule stands.
    assert!(run(&guess, false, "ALTER TABLE t ADD COLUMN b INT", true)
        .unwrap()
        .widened
        .is_empty());
}

const MODIFY: &str = "ALTER TABLE t MODIFY n BIGINT";

#[test]
fn an_alter_is_the_difference_of_two_schemas() {
    let f = Features::of_version("26.9.2.1");
    let id = col("id", ColumnType::Int, "int(11)");
    let n = col("n", ColumnType::Int, "int(11)");
    let big = col("n", ColumnType::Bigint, "bigint(20)");
    let price = Column {
        length: 10,
        scale: 2,
        ..col("price", ColumnType::Decimal, "decimal(10,2)")
    };
    // A target made by hand: price as Float64, and a column of its own.
    let target: BTreeMap<String, ChType> = [
        ("id", ChType::Int(32)),
        ("n", ChType::Int(32)),
        ("price", ChType::Float64),
        (
            "ingested_at",
            ChType::DateTime(crate::clickhouse::types::Span::DATETIME),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let before = vec![id.clone(), n.clone(), price.clone()];
    // CREATE INDEX: the same columns. Nothing changes, the hand-made types stand.
    let same = schema(before.clone());
    assert_eq!(
        changes(&target, &before, &same, "CREATE INDEX i ON t (n)", f, false),
        Ok(ColumnChanges::default())
    );
    // INT -> BIGINT: widened where the stage may change the table, refused where not.
    let wider = schema(vec![id.clone(), big.clone(), price.clone()]);
    assert_eq!(
        changes(&target, &before, &wider, MODIFY, f, true)
            .unwrap()
            .widened,
        vec![("n".to_string(), ChType::Int(64))]
    );
    let e = changes(&target, &before, &wider, MODIFY, f, false).unwrap_err();
    assert!(
        e.contains("column n is now bigint(20)") && e.contains("tables.create is off"),
        "{e}"
    );
    // A dropped source column goes; the target's own column stays.
    let fewer = schema(vec![id.clone(), price.clone()]);
    assert_eq!(
        changes(&target, &before, &fewer, "ALTER TABLE t DROP n", f, true)
            .unwrap()
            .dropped,
        vec!["n".to_string()]
    );
    // A rename: refused, nothing dropped.
    let renamed = schema(vec![
        id.clone(),
        col("m", ColumnType::Int, "int(11)"),
        price.clone(),
    ]);
    // A statement that says neither (the schemas from a statement this stage cannot read).
    let e = changes(
        &target,
        &before,
        &renamed,
        "ALTER TABLE t COMMENT 'x'",
        f,
        true,
    )
    .unwrap_err();
    assert!(e.contains("removes column(s) n and adds m"), "{e}");
    // One that drops n by name and adds m: no rename, both done.
    let change = changes(
        &target,
        &before,
        &renamed,
        "ALTER TABLE t DROP n, ADD m INT",
        f,
        true,
    )
    .unwrap();
    assert_eq!(change.dropped, vec!["n".to_string()]);
    assert_eq!(change.added.len(), 1);
    // Said as a rename: renamed, on every server (before 20.4 by a copy, see rename_column).
    let rename = "ALTER TABLE t RENAME COLUMN n TO m";
    for server in [f, Features::of_version("18.16.1")] {
        let change = changes(&target, &before, &renamed, rename, server, true).unwrap();
        assert_eq!(change.renamed, vec![("n".to_string(), "m".to_string())]);
        assert!(change.dropped.is_empty() && change.added.is_empty() && change.widened.is_empty());
    }
    // CHANGE n m BIGINT: renamed and widened.
    let renamed_wider = schema(vec![id.clone(), col("m", ColumnType::Bigint, "bigint(20)")]);
    let change = changes(
        &target,
        &before,
        &renamed_wider,
        "ALTER TABLE t CHANGE n m BIGINT",
        f,
        true,
    )
    .unwrap();
    assert_eq!(change.renamed, vec![("n".to_string(), "m".to_string())]);
    assert_eq!(change.widened, vec![("m".to_string(), ChType::Int(64))]);
    // Added columns, with what the rows already there hold.
    let email = Column {
        nullable: true,
        ..col("email", ColumnType::Varchar, "varchar(50)")
    };
    let ts = col("ts", ColumnType::Timestamp, "timestamp");
    let more = schema(vec![id.clone(), n.clone(), price.clone(), email.clone()]);
    let change = changes(
        &target,
        &before,
        &more,
        "ALTER TABLE t ADD COLUMN email VARCHAR(50) DEFAULT 'none@x'",
        f,
        true,
    )
    .unwrap();
    assert_eq!(
        change.added,
        vec![(email.clone(), Some("'none@x'".to_string()))]
    );
    let change = changes(
        &target,
        &before,
        &more,
        "ALTER TABLE t ADD email VARCHAR(50)",
        f,
        true,
    )
    .unwrap();
    assert_eq!(change.added, vec![(email.clone(), None)]);
    let stamped = schema(vec![id.clone(), n.clone(), price.clone(), ts]);
    let e = changes(
        &target,
        &before,
        &stamped,
        "ALTER TABLE t ADD ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
        f,
        true,
    )
    .unwrap_err();
    assert!(
        e.contains("adds column ts with the default CURRENT_TIMESTAMP"),
        "{e}"
    );
    // Several statements as one event (read behind the server): renamed, then dropped
    // under the new name, while another column is added.
    let merged: Vec<String> = [
        "ALTER TABLE t RENAME COLUMN n TO r8",
        "ALTER TABLE t ADD COLUMN email VARCHAR(50) DEFAULT 'x'",
        "ALTER TABLE t DROP COLUMN r8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let after = schema(vec![id.clone(), price.clone(), email.clone()]);
    let exact = Before {
        columns: &before,
        exact: true,
    };
    let change = column_changes(&target, &exact, &after, &merged, f, true).unwrap();
    assert_eq!(change.dropped, vec!["n".to_string()]);
    assert_eq!(change.added, vec![(email.clone(), Some("'x'".to_string()))]);
    assert!(change.renamed.is_empty());
    // tables.create off: nothing is added.
    let change = changes(
        &target,
        &before,
        &more,
        "ALTER TABLE t ADD email VARCHAR(50)",
        f,
        false,
    )
    .unwrap();
    assert!(change.added.is_empty());
    // After a restart, the earlier schemas' definitions: an unchanged column is unchanged.
    let history = vec![id.clone(), n.clone(), id, big.clone()];
    let again = schema(history[2..].to_vec());
    let widened_target: BTreeMap<String, ChType> = [
        ("id".to_string(), ChType::Int(32)),
        ("n".to_string(), ChType::Int(64)),
    ]
    .into();
    assert_eq!(
        changes(
            &widened_target,
            &history,
            &again,
            "ALTER TABLE t COMMENT 'x'",
            f,
            false
        ),
        Ok(ColumnChanges::default())
    );
}
