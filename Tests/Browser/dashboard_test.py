#!/usr/bin/env python3
"""The operator dashboard in a real headless browser (Debian's chromium, driven by Selenium
through Debian's chromium-driver).

Run by Tests/StoreKeeperCLITests/DashboardBrowserTests.swift against `storekeeper serve` in demo
mode (SQLite, the local App Store, notifications sent to the server). Standalone:

    python3 Tests/Browser/dashboard_test.py --server http://127.0.0.1:8181 \
        --key "$(cat storekeeper-data/dev-secret-key)" --out /tmp/dashboard-shots --idle 20

The story: a player pays at the (local) App Store with no order and no account, so the
server raises an `unattributed_transaction` anomaly. The operator signs in (after a wrong
key is refused), finds it in the anomaly queue, delivers it to an account, and sees that
account's balance and audit change. A forged form post (another site's page auto-submitting
to the dashboard, and a post with the session cookie but no CSRF token) changes nothing, and
an idle session expires. A screenshot of every page is written to --out.

Exit status 0 when every check holds; 1 with the failed check otherwise; 77 when the browser
or Selenium is missing (the Swift test fails on that in CI, skips elsewhere).
"""

import argparse
import base64
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    print("selenium is not installed (pip install selenium)", file=sys.stderr)
    sys.exit(77)

CHROMIUM = os.environ.get("STOREKEEPER_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("STOREKEEPER_CHROMEDRIVER", "/usr/bin/chromedriver")


class Failed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failed(message)
    print(f"ok - {message}")


def api(server, key, method, path, body=None, cookie=None, form=None, headers=None):
    """An HTTP call outside the browser; returns (status, text)."""
    data = None
    all_headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        all_headers["Content-Type"] = "application/json"
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        all_headers["Content-Type"] = "application/x-www-form-urlencoded"
    if key:
        all_headers["Authorization"] = f"Bearer {key}"
    if cookie:
        all_headers["Cookie"] = cookie

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(server + path, data=data, method=method, headers=all_headers)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def arrive(driver, fragment, leaving=None, timeout=20):
    """Waits until the browser's URL contains `fragment` (a click on a link or a form's button
    returns before the next page has loaded)."""
    try:
        WebDriverWait(driver, timeout).until(
            lambda d: fragment in d.current_url and (leaving is None or d.current_url != leaving)
            and d.execute_script("return document.readyState") == "complete")
    except Exception:
        raise Failed(f"the browser did not reach {fragment} within {timeout} s (at {driver.current_url})")
    return True


def unattributed_purchase(server, key, apple_id):
    """Pays at the local App Store with no order: the ONE_TIME_CHARGE notification reaches the
    server, which raises an unattributed_transaction anomaly. Returns (transactionId, anomalyId)."""
    status, text = api(server, None, "POST", "/local-app-store/control/purchases",
                       body={"appleId": apple_id, "productId": "coins_60"})
    check(status == 200, f"the local App Store took the payment ({status})")
    signed = json.loads(text)["signedTransactions"][0]
    payload = signed.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    transaction_id = json.loads(base64.urlsafe_b64decode(payload))["transactionId"]
    deadline = time.time() + 60
    while time.time() < deadline:
        status, text = api(server, key, "GET", "/v1/anomalies?status=open")
        if status == 200:
            for anomaly in json.loads(text)["anomalies"]:
                if anomaly.get("transactionId") == transaction_id and anomaly["kind"] == "unattributed_transaction":
                    return transaction_id, anomaly["id"]
        time.sleep(0.5)
    raise Failed(f"no unattributed_transaction anomaly for {transaction_id} within 60 s")


def subscribe(server, key, account):
    """An order for pro_monthly, paid at the local App Store with its token, submitted."""
    status, text = api(server, key, "POST", "/v1/orders", body={"accountId": account, "productId": "pro_monthly"})
    check(status == 201, f"an order for a subscription ({status} {text[:200]})")
    order = json.loads(text)
    status, text = api(server, None, "POST", "/local-app-store/control/purchases",
                       body={"appleId": "apple-" + account, "productId": "pro_monthly",
                             "appAccountToken": order["appAccountToken"]})
    check(status == 200, f"the local App Store took the subscription ({status})")
    signed = json.loads(text)["signedTransactions"][0]
    status, text = api(server, key, "POST", "/v1/purchases",
                       body={"accountId": account, "orderId": order["orderId"], "signedTransaction": signed})
    check(status == 200, f"the subscription is delivered ({status} {text[:200]})")


def anomaly_status(server, key, anomaly_id):
    for status in ("open", "resolved"):
        code, text = api(server, key, "GET", f"/v1/anomalies?status={status}")
        if code == 200 and any(a["id"] == anomaly_id for a in json.loads(text)["anomalies"]):
            return status
    return None


def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        print(f"no browser: {CHROMIUM} and {DRIVER} are needed (apt-get install chromium chromium-driver)",
              file=sys.stderr)
        sys.exit(77)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1600"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--out", required=True, help="where the screenshots go")
    parser.add_argument("--idle", type=int, required=True, help="the server's dashboard.sessionIdleSeconds")
    args = parser.parse_args()
    server, key = args.server.rstrip("/"), args.key
    os.makedirs(args.out, exist_ok=True)

    def shot(driver, name):
        path = os.path.join(args.out, f"{name}.png")
        driver.save_screenshot(path)
        print(f"screenshot {path}")

    transaction_id, anomaly_id = unattributed_purchase(server, key, f"stranger-{uuid.uuid4().hex[:8]}")
    _, second_anomaly = unattributed_purchase(server, key, f"stranger-{uuid.uuid4().hex[:8]}")
    account = f"dana-{uuid.uuid4().hex[:8]}"

    driver = browser()
    try:
        driver.set_page_load_timeout(30)
        # Not signed in: the sign-in page. A wrong key is refused.
        driver.get(server + "/dashboard")
        check(driver.current_url.endswith("/dashboard/login"), "a visitor is sent to the sign-in page")
        shot(driver, "login")
        driver.find_element(By.NAME, "key").send_keys("sk_wrong_key")
        driver.find_element(By.CSS_SELECTOR, "form.login button").click()
        WebDriverWait(driver, 20).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".error")))
        check("not one of this server" in driver.find_element(By.CSS_SELECTOR, ".error").text,
              "a wrong key is refused with a message")
        check(driver.get_cookie("storekeeper_session") is None, "a wrong key opens no session")
        shot(driver, "login-refused")

        # The right key: the overview, with its charts.
        driver.find_element(By.NAME, "key").send_keys(key)
        driver.find_element(By.CSS_SELECTOR, "form.login button").click()
        WebDriverWait(driver, 20).until(expected_conditions.presence_of_element_located((By.ID, "open-anomalies")))
        check(driver.current_url.rstrip("/").endswith("/dashboard"), "the right key opens the overview")
        cookie = driver.get_cookie("storekeeper_session")
        check(cookie is not None and cookie.get("httpOnly") and cookie.get("sameSite") == "Strict",
              "the session cookie is HttpOnly and SameSite=Strict")
        check(int(driver.find_element(By.ID, "open-anomalies").text) >= 2, "the overview counts the open anomalies")
        check(len(driver.find_elements(By.CSS_SELECTOR, "svg.chart")) >= 3, "the overview draws its charts as SVG")
        check(driver.execute_script("return document.scripts.length") == 0, "the dashboard runs no script")
        shot(driver, "overview")

        # The anomaly queue: the paid-but-unattributed purchase, delivered to an account.
        driver.find_element(By.LINK_TEXT, "Anomalies").click()
        arrive(driver, "/dashboard/anomalies")
        article = driver.find_element(By.ID, f"anomaly-{anomaly_id}")
        check(transaction_id in article.text and "unattributed_transaction" in article.text,
              "the anomaly queue shows the unattributed purchase")
        shot(driver, "anomalies")
        form = article.find_element(By.CSS_SELECTOR, "form.deliver")
        form.find_element(By.NAME, "accountId").send_keys(account)
        form.find_element(By.NAME, "note").send_keys("ticket 4711")
        form.find_element(By.TAG_NAME, "button").click()
        check(arrive(driver, f"/dashboard/accounts/{account}"), "delivering leads to the account page")
        balance = driver.find_element(By.CSS_SELECTOR, '#balances tr[data-currency="coins"] .balance').text
        check(balance == "60", f"the account's balance shows the delivered coins ({balance})")
        audit = driver.find_element(By.CSS_SELECTOR, '#audit tr[data-action="manual_delivery"]').text
        check("ticket 4711" in audit and anomaly_id in audit, "the audit shows who delivered what, with the note")
        check(transaction_id in driver.find_element(By.ID, "ledger").text, "the ledger shows the credit")
        shot(driver, "account")
        status, text = api(server, key, "GET", f"/v1/accounts/{account}")
        check(status == 200 and json.loads(text)["balances"].get("coins") == 60, "the API agrees: 60 coins")
        check(anomaly_status(server, key, anomaly_id) == "resolved", "the anomaly is resolved")

        # Support: credit coins from the account page, at a phone's width too.
        driver.set_window_size(390, 1400)
        credit = driver.find_element(By.ID, "credit-form")
        Select(credit.find_element(By.NAME, "currency")).select_by_visible_text("coins")
        credit.find_element(By.NAME, "amount").send_keys("40")
        credit.find_element(By.NAME, "reason").send_keys("ticket 4712: lost coins")
        before = driver.current_url
        credit.find_element(By.XPATH, ".//button[text()='Credit']").click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before), "crediting returns to the account page")
        balance = driver.find_element(By.CSS_SELECTOR, '#balances tr[data-currency="coins"] .balance').text
        check(balance == "100", f"the credit shows on the account (60 + 40 = {balance})")
        check("Credited" in driver.find_element(By.TAG_NAME, "main").text, "the page says what was done")
        check(driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
              "the account page fits a 390 px screen")
        shot(driver, "account-390")

        # Support at a desktop's width: a grant with its note, a note for the next agent, then
        # the grant ended — each shown on the account page as the API then sees it.
        driver.set_window_size(1400, 1600)
        grant = driver.find_element(By.ID, "grant-form")
        Select(grant.find_element(By.NAME, "entitlement")).select_by_visible_text("pro")
        days = grant.find_element(By.NAME, "days")
        days.clear()
        days.send_keys("3")
        grant.find_element(By.NAME, "note").send_keys("ticket 4713: outage")
        before = driver.current_url
        grant.find_element(By.XPATH, ".//button[text()='Grant']").click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before), "granting returns to the account page")
        grants = driver.find_element(By.ID, "grants").text
        check("pro" in grants and "ticket 4713: outage" in grants, "the grant and its note show on the account page")
        status, text = api(server, key, "GET", f"/v1/accounts/{account}")
        check(any(e["id"] == "pro" and e.get("source") == "grant" for e in json.loads(text)["entitlements"]),
              "the API shows the granted entitlement")
        note = driver.find_element(By.ID, "note-form")
        note.find_element(By.NAME, "text").send_keys("promised 100 coins if it happens again")
        note.find_element(By.NAME, "ticket").send_keys("ZD-4713")
        before = driver.current_url
        note.find_element(By.XPATH, ".//button[text()='Add note']").click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before), "a note returns to the account page")
        notes = driver.find_element(By.ID, "notes").text
        check("promised 100 coins" in notes and "ZD-4713" in notes, "the note shows with its ticket")
        check(driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
              "the account page fits 1400 px")
        shot(driver, "account-1400")
        # Purchase actions: an App Store refund is Apple's (the page says where the player asks);
        # the player's subscription moves to their new account.
        subscribe(server, key, account)
        driver.get(server + f"/dashboard/accounts/{account}")
        purchases = driver.find_element(By.ID, "purchase-form")
        options = purchases.find_elements(By.CSS_SELECTOR, "select[name=transactionId] option")
        check(any("pro_monthly" in o.text for o in options) and any("coins_60" in o.text for o in options),
              "the purchase form lists the account's purchases")
        Select(purchases.find_element(By.NAME, "transactionId")).select_by_visible_text(
            next(o.text for o in options if "coins_60" in o.text))
        purchases.find_element(By.NAME, "reason").send_keys("ticket 4714: wants a refund")
        before = driver.current_url
        purchases.find_element(By.ID, "refund-button").click()
        WebDriverWait(driver, 20).until(lambda d: d.current_url != before)
        check("reportaproblem.apple.com" in driver.find_element(By.TAG_NAME, "body").text,
              "an App Store refund sends the agent to Apple's refund request")
        driver.get(server + f"/dashboard/accounts/{account}")
        purchases = driver.find_element(By.ID, "purchase-form")
        options = purchases.find_elements(By.CSS_SELECTOR, "select[name=transactionId] option")
        Select(purchases.find_element(By.NAME, "transactionId")).select_by_visible_text(
            next(o.text for o in options if "pro_monthly" in o.text))
        purchases.find_element(By.NAME, "reason").send_keys("ticket 4715: bought on the old account")
        purchases.find_element(By.NAME, "toAccountId").send_keys(account + "-new")
        before = driver.current_url
        purchases.find_element(By.ID, "transfer-button").click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before), "a transfer returns to the account")
        check("Transferred" in driver.find_element(By.TAG_NAME, "body").text, "the page says it was transferred")
        status, text = api(server, key, "GET", f"/v1/accounts/{account}-new")
        check(any(e["id"] == "pro" and e.get("active") for e in json.loads(text)["entitlements"]),
              "the API shows the subscription on the new account")
        status, text = api(server, key, "GET", f"/v1/accounts/{account}")
        check(not any(e["id"] == "pro" and e.get("source") != "grant" and e.get("active")
                      for e in json.loads(text)["entitlements"]), "and no longer on the old one")
        shot(driver, "account-purchases-1400")
        end = driver.find_element(By.CSS_SELECTOR, "#grants form button")
        before = driver.current_url
        end.click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before), "ending a grant returns to the account")
        status, text = api(server, key, "GET", f"/v1/accounts/{account}")
        check(not any(e["id"] == "pro" and e.get("source") == "grant" and e.get("active")
                      for e in json.loads(text)["entitlements"]), "the ended grant no longer entitles")
        driver.set_window_size(390, 1400)
        check(driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
              "the account page with grants and notes fits a 390 px screen")
        shot(driver, "account-support-390")
        driver.set_window_size(1280, 1600)
        status, text = api(server, key, "GET", f"/v1/accounts/{account}")
        check(status == 200 and json.loads(text)["balances"].get("coins") == 100, "the API agrees: 100 coins")

        # Search by transaction id from the header.
        search = driver.find_element(By.CSS_SELECTOR, "form.search input[name=q]")
        search.send_keys(transaction_id)
        before = driver.current_url
        driver.find_element(By.CSS_SELECTOR, "form.search button").click()
        check(arrive(driver, f"/dashboard/accounts/{account}", leaving=before),
              "searching the transaction id finds the account")
        driver.find_element(By.LINK_TEXT, "Webhooks").click()
        arrive(driver, "/dashboard/webhooks")
        check("Webhooks" in driver.find_element(By.TAG_NAME, "h1").text, "the webhooks page opens")
        shot(driver, "webhooks")

        # Analytics: a subscription bought through an order shows in MRR and active
        # subscriptions; the filters narrow it; a bad date is a message, not a crash.
        subscribe(server, key, "analyst-" + uuid.uuid4().hex[:8])
        driver.find_element(By.LINK_TEXT, "Analytics").click()
        arrive(driver, "/dashboard/analytics")
        figures = driver.find_elements(By.CSS_SELECTOR, "figure.chart-box")
        check(len(figures) == 9, f"the analytics page charts the nine metrics ({len(figures)})")
        for metric in ["mrr", "active_subscriptions", "active_trials", "new_subscriptions",
                       "churned_subscriptions", "trial_conversion", "refund_rate", "proceeds", "realized_ltv"]:
            figure = driver.find_element(By.ID, f"metric-{metric}")
            check(figure.find_elements(By.TAG_NAME, "svg") and figure.find_elements(By.TAG_NAME, "table"),
                  f"{metric}: a chart and its table")
        active = driver.find_element(By.ID, "metric-active_subscriptions")
        cells = active.find_elements(By.CSS_SELECTOR, "tbody tr:last-child td")
        check(float(cells[1].get_attribute("textContent")) >= 1, "today's active subscriptions count the new one")
        mrr = driver.find_element(By.ID, "metric-mrr")
        cells = mrr.find_elements(By.CSS_SELECTOR, "tbody tr:last-child td")
        check(float(cells[1].get_attribute("textContent")) >= 4.99, "today's MRR holds its monthly price")
        check(abs(float(cells[2].get_attribute("textContent")) - 12 * float(cells[1].get_attribute("textContent")))
              < 0.005, "ARR beside it is 12 × MRR")
        shot(driver, "analytics")
        Select(driver.find_element(By.NAME, "store")).select_by_value("google_play")
        Select(driver.find_element(By.NAME, "interval")).select_by_value("week")
        before = driver.current_url
        driver.find_element(By.CSS_SELECTOR, "#analytics-filters button").click()
        arrive(driver, "store=google_play", leaving=before)
        mrr = driver.find_element(By.ID, "metric-mrr")
        values = [float(td.get_attribute("textContent"))
                  for td in mrr.find_elements(By.CSS_SELECTOR, "tbody tr td:nth-child(2)")]
        check(values and all(v == 0 for v in values), "filtered to Google Play, the App Store MRR is gone")
        check(Select(driver.find_element(By.NAME, "store")).first_selected_option.get_attribute("value")
              == "google_play", "the form keeps its filters")
        shot(driver, "analytics-filtered")
        driver.get(server + "/dashboard/analytics?from=2026-02-30")
        alert = driver.find_element(By.CSS_SELECTOR, "p.error[role=alert]")
        check("YYYY-MM-DD" in alert.text, "a bad date is explained on the page")
        shot(driver, "analytics-error")

        # Forged form posts change nothing.
        session = f"storekeeper_session={driver.get_cookie('storekeeper_session')['value']}"
        form_fields = {"action": "deliver", "accountId": "mallory", "note": "forged"}
        status, _ = api(server, None, "POST", f"/dashboard/anomalies/{second_anomaly}/resolve", cookie=session,
                        form=form_fields)
        check(status == 403, f"a post with the session cookie and no CSRF token is refused ({status})")
        status, _ = api(server, None, "POST", f"/dashboard/anomalies/{second_anomaly}/resolve", cookie=session,
                        form={**form_fields, "_csrf": "0" * 64})
        check(status == 403, f"a post with a wrong CSRF token is refused ({status})")
        with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as page:
            page.write(f"""<!doctype html><html><body><form id=f method=post
                action="{server}/dashboard/anomalies/{second_anomaly}/resolve">
                <input name=action value=deliver><input name=accountId value=mallory></form>
                <script>document.getElementById('f').submit()</script></body></html>""")
        driver.get("file://" + page.name)
        arrive(driver, f"/dashboard/anomalies/{second_anomaly}/resolve")
        shot(driver, "forged-post")
        check("Refused" in driver.page_source or "Signed out" in driver.page_source,
              "another site's auto-submitting form is refused")
        check(anomaly_status(server, key, second_anomaly) == "open", "the forged posts changed nothing")
        status, text = api(server, key, "GET", "/v1/accounts/mallory")
        check(status == 200 and not json.loads(text)["balances"], "mallory got nothing")

        # Hostile text an app user controls (account ids hiding `<` and `"` in grapheme clusters,
        # a stored <meta http-equiv=refresh>) stays text on every page: nothing navigates.
        hostile = ["\u0600<meta http-equiv=refresh content=0;url=//evil.example/p>\u0301",
                   "\u0600<", ">\u0301", "\"\u0301", "'\u0301"]
        shared = str(7_050_000_000 + int(time.time()) % 1_000_000)
        for index, text in enumerate(hostile):
            status, _ = api(server, key, "POST", "/v1/orders",
                            body={"accountId": f"x{index}{text}", "productId": "coins_60", "appTransactionId": shared})
            check(status == 201, f"an order for a hostile account id is taken ({status})")
        status, _ = api(server, key, "POST", "/v1/orders",
                        body={"accountId": "mallory", "productId": "coins_60", "appTransactionId": hostile[0]})
        check(status == 400, "a non-numeric appTransactionId is refused")
        for path in ["/dashboard/anomalies", "/dashboard/accounts/" + urllib.parse.quote("x0" + hostile[0], safe=""),
                     "/dashboard/search?q=" + urllib.parse.quote("x1" + hostile[1], safe="")]:
            driver.get(server + path)
            time.sleep(1.5)
            check(driver.current_url.startswith(server + "/dashboard"), f"{path} stays on the dashboard")
            check(driver.execute_script("return document.querySelectorAll('meta[http-equiv]').length") == 0,
                  f"{path} has no injected meta element")
        driver.get(server + "/dashboard/accounts/" + urllib.parse.quote("x0" + hostile[0], safe=""))
        check(("x0" + hostile[0]) in driver.execute_script("return document.body.textContent"),
              "the hostile account id is shown as text on its page")
        driver.get(server + "/dashboard/anomalies")
        check("evil.example" in driver.execute_script("return document.body.textContent")
              or "shared_apple_id" in driver.page_source, "the shared Apple Account anomaly is listed, as text")
        shot(driver, "hostile-text")

        # An idle session expires.
        driver.get(server + "/dashboard")
        check(driver.current_url.rstrip("/").endswith("/dashboard"), "still signed in while active")
        time.sleep(args.idle + 3)
        driver.get(server + "/dashboard/anomalies")
        check(arrive(driver, "/dashboard/login"), "an idle session has expired")
        check("expired" in driver.find_element(By.CSS_SELECTOR, ".error").text, "the sign-in page says it expired")
        shot(driver, "expired")
    finally:
        driver.quit()
    print("all dashboard browser checks passed")


if __name__ == "__main__":
    try:
        main()
    except Failed as failure:
        print(f"FAILED - {failure}", file=sys.stderr)
        sys.exit(1)
