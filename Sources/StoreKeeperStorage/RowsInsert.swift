import SQLKit

/// One value of a `RowsInsert`, typed as its column is, so PostgreSQL receives a NULL as its
/// column's type (an `Int64?` bind, as SQLKit would send it).
enum RowValue: Sendable, Hashable {
    case integer(Int64?)
    case text(String?)
    case real(Double?)

    static func int(_ value: Int?) -> RowValue { .integer(value.map(Int64.init)) }
    static func bool(_ value: Bool) -> RowValue { .integer(value ? 1 : 0) }

    var sqlite: SQLiteValue {
        switch self {
        case .integer(let value): value.map(SQLiteValue.integer) ?? .null
        case .text(let value): value.map(SQLiteValue.text) ?? .null
        case .real(let value): value.map(SQLiteValue.float) ?? .null
        }
    }

    /// What SQLKit binds on PostgreSQL: the value itself, or a NULL of the column's type.
    var bind: any Encodable & Sendable {
        switch self {
        case .integer(let value): if let value { value } else { value }
        case .text(let value): if let value { value } else { value }
        case .real(let value): if let value { value } else { value }
        }
    }
}

/// `INSERT INTO table (columns) VALUES (…), (…) suffix` — the multi-row inserts of the delivery
/// path. SQLite runs it straight on its connection (`SQLiteDirectDatabase`), its statement
/// cached by its shape, each value bound as it is: SQLKit's serialization and the dynamic cast
/// of each `any Encodable` bind were 17 % of the SQLite writer thread's time (`perf`, `bench
/// --purchases`), and the writer is the serial part of every delivery. PostgreSQL gets the
/// same statement through SQLKit's serializer (one of the `CombinedWrites`).
struct RowsInsert: SQLExpression, Sendable {
    let table: String
    let columns: [String]
    /// Row after row, `columns.count` values each.
    private(set) var values: [RowValue] = []
    /// After the rows: `ON CONFLICT …`, or nothing. Constant text only (no values).
    let suffix: String

    init(into table: String, columns: [String], suffix: String = "") {
        self.table = table
        self.columns = columns
        self.suffix = suffix
    }

    var isEmpty: Bool { values.isEmpty }
    var rowCount: Int { columns.isEmpty ? 0 : values.count / columns.count }

    mutating func append(_ row: [RowValue]) {
        precondition(row.count == columns.count, "a row of \(row.count) values for \(columns.count) columns")
        values += row
    }

    private var head: String {
        "INSERT INTO \"\(table)\" (\(columns.map { "\"\($0)\"" }.joined(separator: ", "))) VALUES "
    }

    /// One key per SQL text: the head, the suffix and the number of rows.
    var shapeKey: String { "\(head)#\(rowCount)#\(suffix)" }

    /// SQLite's text (`?` placeholders).
    var sqliteText: String {
        let row = "(" + Array(repeating: "?", count: columns.count).joined(separator: ", ") + ")"
        var text = head
        text.reserveCapacity(head.utf8.count + (row.utf8.count + 2) * rowCount + suffix.utf8.count + 1)
        for index in 0..<rowCount {
            if index > 0 { text += ", " }
            text += row
        }
        if !suffix.isEmpty { text += " " + suffix }
        return text
    }

    func serialize(to serializer: inout SQLSerializer) {
        serializer.write(head)
        for index in 0..<rowCount {
            serializer.write(index == 0 ? "(" : ", (")
            for column in 0..<columns.count {
                if column > 0 { serializer.write(", ") }
                serializer.write(bind: values[index * columns.count + column].bind)
            }
            serializer.write(")")
        }
        if !suffix.isEmpty { serializer.write(" " + suffix) }
    }
}

extension RowsInsert {
    /// The statement's rows (`RETURNING …`), read as any query's.
    func fetch(on database: any SQLDatabase) -> some SQLQueryFetcher { Fetch(query: self, database: database) }

    private final class Fetch: SQLQueryFetcher {
        let query: any SQLExpression
        let database: any SQLDatabase

        init(query: any SQLExpression, database: any SQLDatabase) {
            self.query = query
            self.database = database
        }
    }
}
