import Foundation
import Testing

/// The front door holds together: every relative link of README.md, BENCHMARKS.md and docs/
/// names a file that exists, and an anchor into a Markdown page names one of its headings;
/// README stays under 250 lines; the index by task links every guide in docs/.
@Suite struct DocsLinkTests {
    static let root = OpenAPITests.root

    static func markdownFiles() throws -> [URL] {
        var files = [root.appendingPathComponent("README.md"), root.appendingPathComponent("BENCHMARKS.md")]
        let docs = root.appendingPathComponent("docs")
        let enumerator = try #require(FileManager.default.enumerator(at: docs, includingPropertiesForKeys: nil))
        for case let url as URL in enumerator where url.pathExtension == "md" { files.append(url) }
        return files
    }

    /// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
    static func anchor(_ heading: String) -> String {
        String(
            heading.lowercased().compactMap { character -> Character? in
                if character == " " { return "-" }
                if character.isLetter || character.isNumber || character == "-" || character == "_" { return character }
                return nil
            })
    }

    static func anchors(of file: URL) throws -> Set<String> {
        let text = try String(contentsOf: file, encoding: .utf8)
        var inCode = false
        var result: Set<String> = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") { inCode.toggle() }
            guard !inCode, line.hasPrefix("#") else { continue }
            result.insert(anchor(String(line.drop(while: { $0 == "#" }).trimmingCharacters(in: .whitespaces))))
        }
        return result
    }

    @Test func everyRelativeLinkAndAnchorResolves() throws {
        var checked = 0
        var broken: [String] = []
        for file in try Self.markdownFiles() {
            let text = try String(contentsOf: file, encoding: .utf8)
            let pattern = try Regex(#"\]\(([^)\s]+)\)"#)
            for match in text.matches(of: pattern) {
                guard let link = match.output[1].substring.map(String.init),
                    !link.hasPrefix("http"), !link.hasPrefix("mailto:")
                else { continue }
                let parts = link.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)
                let target =
                    parts[0].isEmpty
                    ? file : file.deletingLastPathComponent().appendingPathComponent(String(parts[0])).standardized
                checked += 1
                guard FileManager.default.fileExists(atPath: target.path) else {
                    broken.append("\(file.lastPathComponent): \(link)")
                    continue
                }
                if parts.count == 2, target.pathExtension == "md",
                    !(try Self.anchors(of: target)).contains(String(parts[1]))
                {
                    broken.append("\(file.lastPathComponent): \(link) (no such heading)")
                }
            }
        }
        #expect(checked > 100, "links found: \(checked)")
        #expect(broken.isEmpty, "\(broken)")
    }

    /// The repository stands alone: no doc, help text or comment sends a reader outside it (the
    /// team's working material is not shipped), and no relative link leaves the repository.
    @Test func nothingPointsOutsideTheRepository() throws {
        let root = Self.root.standardized
        let outside = try Regex(
            #"\.\./(shared|spec|design|seeds|vectors|certs)/|shared/(design|spec|vectors|certs|seeds)"#)
        var found: [String] = []
        let enumerator = FileManager.default.enumerator(at: root, includingPropertiesForKeys: nil)
        while let url = enumerator?.nextObject() as? URL {
            let path = url.path
            if path.contains("/.build") || path.contains("/.git/") || path.contains("/Fuzz/") {
                enumerator?.skipDescendants()
                continue
            }
            guard
                ["md", "swift", "yaml", "yml", "sh", "py", "service"].contains(url.pathExtension)
                    || path.contains("/scripts/") || path.contains("/.ci/"),
                let text = try? String(contentsOf: url, encoding: .utf8)
            else { continue }
            if text.contains(outside) { found.append(String(path.dropFirst(root.path.count))) }
            guard url.pathExtension == "md" else { continue }
            for match in text.matches(of: try Regex(#"\]\(([^)\s#]+)"#)) {
                guard let link = match.output[1].substring.map(String.init), !link.contains(":") else { continue }
                let target = url.deletingLastPathComponent().appendingPathComponent(link).standardized.path
                if !target.hasPrefix(root.path) { found.append("\(path.dropFirst(root.path.count)): \(link)") }
            }
        }
        #expect(found.isEmpty, "\(found)")
    }

    @Test func readmeIsShortAndTheIndexLinksEveryGuide() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.split(separator: "\n", omittingEmptySubsequences: false).count < 250)
        let index = try String(contentsOf: Self.root.appendingPathComponent("docs/README.md"), encoding: .utf8)
        let guides = try FileManager.default.contentsOfDirectory(atPath: Self.root.appendingPathComponent("docs").path)
            .filter { $0.hasSuffix(".md") && $0 != "README.md" }
        #expect(guides.count > 15)
        for guide in guides {
            #expect(
                index.contains("(\(guide)") || index.contains("(\(guide)#"), "docs/README.md does not link \(guide)")
        }
    }
}
