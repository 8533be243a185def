#!/usr/bin/env python3
"""Every dashboard template and chart, rendered with hostile text, in a real headless browser
(Debian's chromium through Selenium).

Run by Tests/StoreKeeperServerTests/SecondAuditTests.swift, which writes the pages and a
pages.json manifest into --pages: for each template, a page rendered with a placeholder in every
value and one page per hostile string (grapheme clusters that hide `<`, `>`, `"` or `'` from a
per-Character escaper, one of them a `<meta http-equiv=refresh>` that would send the operator's
browser elsewhere).

For each hostile page: the browser stays on it (nothing navigates), it has no <meta http-equiv>,
it has exactly as many elements and attributes as the placeholder page, and the hostile text
appears, as text or attribute values, exactly where the placeholder did.

Exit status 0 when every check holds; 1 with the failed check; 77 when the browser or Selenium
is missing.
"""

import argparse
import json
import os
import sys
import time

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
except ImportError:
    print("selenium is not installed (pip install selenium)", file=sys.stderr)
    sys.exit(77)

CHROMIUM = os.environ.get("STOREKEEPER_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("STOREKEEPER_CHROMEDRIVER", "/usr/bin/chromedriver")

# Every text node's data and every attribute value, and the shape of the document.
INSPECT = """
const texts = [];
let elements = 0, attributes = 0;
const walk = (node) => {
  if (node.nodeType === Node.TEXT_NODE) { texts.push(node.data); return; }
  if (node.nodeType !== Node.ELEMENT_NODE) return;
  elements += 1;
  for (const a of node.attributes) { attributes += 1; texts.push(a.value); }
  for (const child of node.childNodes) walk(child);
};
walk(document.documentElement);
return {texts: texts, elements: elements, attributes: attributes,
        metas: document.querySelectorAll('meta[http-equiv]').length, url: location.href};
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", required=True)
    args = parser.parse_args()
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        print(f"no browser: {CHROMIUM} and {DRIVER} are needed", file=sys.stderr)
        sys.exit(77)
    with open(os.path.join(args.pages, "pages.json")) as manifest:
        pages = json.load(manifest)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    failures = []
    try:
        driver.set_page_load_timeout(30)
        placeholders = {}
        for entry in pages:
            name = entry["placeholder"]
            if name not in placeholders:
                driver.get("file://" + os.path.join(args.pages, name))
                placeholders[name] = driver.execute_script(INSPECT)
        # Load every hostile page first, then look at each after a refresh would have fired.
        for entry in pages:
            url = "file://" + os.path.join(args.pages, entry["page"])
            driver.get(url)
            time.sleep(0.3)
            seen = driver.execute_script(INSPECT)
            expected = placeholders[entry["placeholder"]]
            marker, text = entry["marker"], entry["text"]
            label = f"{entry['page']} ({text!r})"
            if seen["url"] != url:
                failures.append(f"{label}: the browser left the page for {seen['url']}")
            if seen["metas"] != 0:
                failures.append(f"{label}: a <meta http-equiv> is in the document")
            if (seen["elements"], seen["attributes"]) != (expected["elements"], expected["attributes"]):
                failures.append(f"{label}: {seen['elements']} elements / {seen['attributes']} attributes, "
                                f"expected {expected['elements']} / {expected['attributes']}")
            want = sum(t.count(marker) for t in expected["texts"])
            got = sum(t.count(text) for t in seen["texts"])
            if want == 0 or got != want:
                failures.append(f"{label}: the text appears {got} times as text or attribute value, expected {want}")
            else:
                print(f"ok - {label}: {got} values, all text")
    finally:
        driver.quit()
    if failures:
        for failure in failures:
            print(f"FAILED - {failure}", file=sys.stderr)
        sys.exit(1)
    print("all escaping browser checks passed")


if __name__ == "__main__":
    main()
