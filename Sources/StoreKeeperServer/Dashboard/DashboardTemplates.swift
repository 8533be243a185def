/// The dashboard's Mustache templates and stylesheet, compiled into the binary: nothing to
/// deploy beside it, nothing from a CDN. `{{x}}` is HTML-escaped; `{{{x}}}` only ever takes
/// markup the server built itself (a page body, an SVG chart).
enum DashboardTemplates {
    static let all: [String: String] = [
        "layout": layout, "login": login, "overview": overview, "anomalies": anomalies, "search": search,
        "account": account, "webhooks": webhooks, "message": message, "analytics": analytics, "chart": chart,
        "data": data,
    ]

    /// Transactions, subscriptions and webhook events between two dates, with the CSV of the range.
    static let data = """
        <h1>Data</h1>
        <form class="filters" method="get" action="/dashboard/data" id="data-filters">
        <label>Rows <select name="kind">{{#kinds}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/kinds}}</select></label>
        <label>Since <input type="date" name="since" value="{{since}}"></label>
        <label>Until (not included) <input type="date" name="until" value="{{until}}"></label>
        <button type="submit">Show</button>
        </form>
        <p><a id="data-download" href="{{download}}">Download the {{kindName}} of this range as CSV</a> (up to 100,000 rows; more: <code>GET /v1/export/{{kindName}}</code>, paged).</p>
        {{^hasRows}}<p class="empty">No {{kindName}} in this range yet.</p>{{/hasRows}}
        {{#hasRows}}<section><table id="data-table"><thead><tr>{{#columns}}<th>{{.}}</th>{{/columns}}</tr></thead>
        <tbody>{{#rows}}<tr>{{#cells}}<td>{{.}}</td>{{/cells}}</tr>{{/rows}}</tbody></table></section>{{/hasRows}}
        {{#hasNext}}<p><a id="data-next" href="{{next}}">Next {{kindName}}</a></p>{{/hasNext}}
        """

    static let layout = """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · StoreKeeper</title>
        <link rel="stylesheet" href="/dashboard/static/style.css">
        </head>
        <body>
        <header>
        <a class="brand" href="/dashboard">StoreKeeper</a>
        {{#signedIn}}
        <nav>
        <a href="/dashboard"{{#navOverview}} aria-current="page"{{/navOverview}}>Overview</a>
        <a href="/dashboard/analytics"{{#navAnalytics}} aria-current="page"{{/navAnalytics}}>Analytics</a>
        <a href="/dashboard/anomalies"{{#navAnomalies}} aria-current="page"{{/navAnomalies}}>Anomalies</a>
        <a href="/dashboard/data"{{#navData}} aria-current="page"{{/navData}}>Data</a>
        {{^limited}}<a href="/dashboard/webhooks"{{#navWebhooks}} aria-current="page"{{/navWebhooks}}>Webhooks</a>{{/limited}}
        </nav>
        <form class="search" method="get" action="/dashboard/search" role="search">
        <input type="search" name="q" placeholder="account, order, transaction id, GPA order id, purchase token, payment id" aria-label="Search" value="{{query}}">
        <button type="submit">Search</button>
        </form>
        <span class="hint" id="signed-in-as">{{signedInAs}}</span>
        <form method="post" action="/dashboard/logout"><input type="hidden" name="_csrf" value="{{csrf}}"><button type="submit" class="link">Sign out</button></form>
        <form method="post" action="/dashboard/logout-everywhere"><input type="hidden" name="_csrf" value="{{csrf}}"><button type="submit" class="link" id="sign-out-everywhere">Sign out everywhere</button></form>
        {{/signedIn}}
        </header>
        <main>
        {{#flash}}<p class="flash" role="status">{{flash}}</p>{{/flash}}
        {{{body}}}
        </main>
        </body>
        </html>
        """

    static let login = """
        <h1>Sign in</h1>
        {{#error}}<p class="error" role="alert">{{error}}</p>{{/error}}
        <form class="login" method="post" action="/dashboard/login">
        <label for="key">Secret key</label>
        <input id="key" type="password" name="key" autocomplete="current-password" required autofocus>
        <button type="submit">Sign in</button>
        </form>
        <p class="hint">Any key of <code>auth.secretKeys</code> or <code>auth.keys</code> (a <code>read</code> key sees, a <code>support</code> key acts; a key limited to some apps sees their rows only). In demo mode: <code>storekeeper-data/dev-secret-key</code>.</p>
        """

    static let overview = """
        <h1>Overview</h1>
        {{#headline}}
        <section class="cards headline" aria-label="Headline figures">
        <a class="card" href="/dashboard/analytics"><span class="figure" id="headline-mrr">{{mrr}}</span><span>MRR today</span></a>
        <a class="card" href="/dashboard/analytics"><span class="figure" id="headline-today">{{proceedsToday}}</span><span>proceeds today</span></a>
        <a class="card" href="/dashboard/analytics?interval=month"><span class="figure" id="headline-month">{{proceedsMonth}}</span><span>proceeds this month</span></a>
        </section>
        <p class="note">Money as analytics counts it: by purchase date in {{timeZone}}, after the stores' commission, Sandbox never counted. The charts below count deliveries by UTC day.</p>
        {{/headline}}
        {{#empty}}<p class="empty" id="empty-overview">No data yet: purchases, refunds and subscriptions appear here once the first purchase is delivered. Try <code>storekeeper demo</code> to see a populated dashboard.</p>{{/empty}}
        <section class="cards">
        <a class="card" href="/dashboard/anomalies"><span class="figure" id="open-anomalies">{{openAnomalies}}</span><span>open anomalies</span></a>
        <div class="card"><span class="figure">{{deliveriesTotal}}</span><span>deliveries, last {{days}} days</span></div>
        <div class="card"><span class="figure">{{activeSubscriptions}}</span><span>subscriptions entitled (active + grace period)</span></div>
        <div class="card"><span class="figure">{{pendingJobs}}</span><span>jobs pending</span></div>
        <div class="card"><span class="figure">{{pendingNotifications}}</span><span>notifications to apply</span></div>
        <a class="card" href="/dashboard/webhooks"><span class="figure">{{pendingWebhooks}} / {{deadLetters}}</span><span>webhooks pending / dead letters</span></a>
        </section>
        {{#hasData}}{{#charts}}{{> chart}}{{/charts}}{{/hasData}}
        """

    /// One chart with its table fallback (the overview's and the analytics page's).
    static let chart = """
        <figure class="chart-box"{{#metric}} id="metric-{{metric}}"{{/metric}}>
        {{{svg}}}
        <details><summary>As a table</summary>
        <table><thead><tr><th>{{labelHeader}}</th>{{#columns}}<th class="num">{{.}}</th>{{/columns}}</tr></thead>
        <tbody>{{#rows}}<tr><td>{{label}}</td>{{#cells}}<td class="num">{{.}}</td>{{/cells}}</tr>{{/rows}}</tbody></table>
        </details>
        </figure>
        """

    /// The same numbers as `GET /v1/analytics/{metric}` (one computation), filtered by a form.
    static let analytics = """
        <h1>Analytics</h1>
        <form class="filters" method="get" action="/dashboard/analytics" id="analytics-filters">
        <label>From <input type="date" name="from" value="{{from}}"></label>
        <label>To <input type="date" name="to" value="{{to}}"></label>
        <label>Interval <select name="interval">{{#intervals}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/intervals}}</select></label>
        <label>App <select name="appId">{{^limited}}<option value="">all</option>{{/limited}}{{#apps}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/apps}}</select></label>
        <label>Store <select name="store"><option value="">all</option>{{#stores}}<option value="{{value}}"{{#selected}} selected{{/selected}}>{{value}}</option>{{/stores}}</select></label>
        <label>Product <input type="text" name="productId" value="{{productId}}" maxlength="200"></label>
        <label>Country <input type="text" name="country" value="{{country}}" maxlength="3" placeholder="USA"></label>
        <button type="submit">Show</button>
        </form>
        {{#error}}<p class="error" role="alert">{{error}}</p>{{/error}}
        <p class="note">{{#timeZone}}Days in {{timeZone}}; {{/timeZone}}money converted into {{currency}} ({{ratesSource}}){{#unconverted}}; without a rate, left out: {{unconverted}}{{/unconverted}}. Definitions: docs/analytics.md. Sandbox, Xcode and Family Sharing never count.</p>
        {{#charts}}{{> chart}}{{/charts}}
        """

    static let anomalies = """
        <h1>Anomalies</h1>
        <p class="tabs"><a href="/dashboard/anomalies?status=open"{{#open}} aria-current="page"{{/open}}>Open</a> <a href="/dashboard/anomalies?status=resolved"{{#resolved}} aria-current="page"{{/resolved}}>Resolved</a></p>
        {{^items}}<p class="empty">Nothing here.</p>{{/items}}
        {{#items}}
        <article class="anomaly" id="anomaly-{{id}}" data-kind="{{kind}}">
        <h2>{{kind}} <small>{{createdAt}}</small></h2>
        <p>{{detail}}</p>
        <dl>
        {{#transactionId}}<dt>Transaction</dt><dd><a href="/dashboard/search?q={{transactionId}}">{{transactionId}}</a></dd>{{/transactionId}}
        {{#store}}<dt>Store</dt><dd>{{store}}{{#appId}} · app {{appId}}{{/appId}}</dd>{{/store}}
        {{#orderId}}<dt>Order</dt><dd>{{orderId}}</dd>{{/orderId}}
        {{#accountId}}<dt>Account</dt><dd><a href="/dashboard/accounts/{{accountPath}}">{{accountId}}</a></dd>{{/accountId}}
        {{#productId}}<dt>Product</dt><dd>{{productId}}</dd>{{/productId}}
        {{#resolution}}<dt>Resolution</dt><dd>{{resolution}} {{resolvedAt}}</dd>{{/resolution}}
        </dl>
        {{#isOpen}}{{#canSupport}}
        <div class="actions">
        {{#deliverable}}
        <form method="post" action="/dashboard/anomalies/{{id}}/resolve" class="deliver">
        <input type="hidden" name="_csrf" value="{{csrf}}">
        <input type="hidden" name="action" value="deliver">
        <label>Deliver to account <input name="accountId" value="{{accountId}}" required maxlength="128"></label>
        <label>Note <input name="note" maxlength="500"></label>
        <button type="submit">Deliver</button>
        </form>
        {{/deliverable}}
        <form method="post" action="/dashboard/anomalies/{{id}}/resolve" class="dismiss">
        <input type="hidden" name="_csrf" value="{{csrf}}">
        <input type="hidden" name="action" value="dismiss">
        <label>Note <input name="note" maxlength="500"></label>
        <button type="submit" class="secondary">Dismiss</button>
        </form>
        </div>
        {{/canSupport}}{{/isOpen}}
        </article>
        {{/items}}
        """

    static let search = """
        <h1>Search</h1>
        {{^hits}}<p class="empty">Nothing has the id <code>{{query}}</code>: no account, order, transaction, original transaction or anomaly.</p>{{/hits}}
        <ul class="hits">
        {{#hits}}<li>{{kind}}: {{#accountId}}<a href="/dashboard/accounts/{{accountPath}}">account {{accountId}}</a>{{/accountId}}{{#anomalyId}} <a href="/dashboard/anomalies?status=all#anomaly-{{anomalyId}}">anomaly {{anomalyId}}</a>{{/anomalyId}}</li>{{/hits}}
        </ul>
        """

    static let account = """
        <h1>Account <code id="account-id">{{accountId}}</code></h1>
        <p id="consent">Consent to share consumption data with Apple: <strong>{{consent}}</strong>{{#consentSource}} ({{consentSource}}){{/consentSource}}</p>
        <section id="apple-accounts"><h2>Apple Accounts</h2>
        {{^appleAccounts}}<p class="empty">No Apple Account seen yet.</p>{{/appleAccounts}}
        <ul>{{#appleAccounts}}<li><code>{{id}}</code> <a href="?appTransaction={{id}}#apple-accounts">app transaction</a></li>{{/appleAccounts}}</ul>
        {{#appTransaction}}<table id="app-transaction"><tbody>
        <tr><th>appTransactionId</th><td>{{appTransactionId}}</td></tr><tr><th>Environment</th><td>{{environment}}</td></tr>
        <tr><th>Original version</th><td>{{originalApplicationVersion}}</td></tr><tr><th>Original purchase</th><td>{{originalPurchaseDate}}</td></tr>
        <tr><th>Platform</th><td>{{originalPlatform}}</td></tr><tr><th>Accounts</th><td>{{accounts}}</td></tr></tbody></table>{{/appTransaction}}
        {{#appTransactionError}}<p class="empty">{{appTransactionError}}</p>{{/appTransactionError}}
        </section>
        {{#hasRescissions}}<section><h2>Consent withdrawn by a parent</h2><table id="rescissions"><thead><tr><th>Received</th><th>Apple Account</th><th>Environment</th></tr></thead>
        <tbody>{{#rescissions}}<tr><td>{{receivedAt}}</td><td><code>{{appTransactionId}}</code></td><td>{{environment}}</td></tr>{{/rescissions}}</tbody></table></section>{{/hasRescissions}}
        <section>
        <h2>Balances</h2>
        {{^balances}}<p class="empty">No balances.</p>{{/balances}}
        {{#hasBalances}}<table id="balances"><thead><tr><th>Currency</th><th class="num">Balance</th></tr></thead>
        <tbody>{{#balances}}<tr data-currency="{{currency}}"><td>{{currency}}</td><td class="num balance">{{amount}}</td></tr>{{/balances}}</tbody></table>{{/hasBalances}}
        </section>
        <section id="support"><h2>Support</h2>
        {{^canSupport}}<p class="hint" id="read-only">Signed in with {{roleLabel}}, a read key: its pages show everything, its forms are for support keys.</p>{{/canSupport}}
        {{#canSupport}}
        <form class="support" id="credit-form" method="post" action="/dashboard/accounts/{{accountPath}}/credit">
        <input type="hidden" name="_csrf" value="{{csrf}}"><input type="hidden" name="idempotencyKey" value="{{idempotencyKey}}">
        <label>Currency <select name="currency">{{#currencies}}<option>{{currency}}</option>{{/currencies}}</select></label>
        <label>Amount <input name="amount" type="number" min="1" required></label>
        <label>Reason <input name="reason" required maxlength="500" placeholder="ticket 123: lost coins"></label>
        <button type="submit">Credit</button>
        <button type="submit" formaction="/dashboard/accounts/{{accountPath}}/debit">Debit</button>
        </form>
        <form class="support" id="grant-form" method="post" action="/dashboard/accounts/{{accountPath}}/grant">
        <input type="hidden" name="_csrf" value="{{csrf}}">
        <label>Entitlement <select name="entitlement">{{#grantable}}<option>{{entitlement}}</option>{{/grantable}}</select></label>
        <label>Days <input name="days" type="number" min="1" max="3650" value="7"></label>
        <label><input name="forever" type="checkbox" value="1"> for good</label>
        <label>Note <input name="note" maxlength="500" placeholder="ticket 123: outage compensation"></label>
        <button type="submit">Grant</button>
        </form>
        {{#hasPurchases}}
        <form class="support" id="purchase-form" method="post" action="/dashboard/accounts/{{accountPath}}/purchases/refund">
        <input type="hidden" name="_csrf" value="{{csrf}}"><input type="hidden" name="idempotencyKey" value="{{idempotencyKey}}">
        <label>Purchase <select name="transactionId">{{#purchases}}<option value="{{transactionId}}">{{label}}</option>{{/purchases}}</select></label>
        <label>Reason <input name="reason" required maxlength="500" placeholder="ticket 123: charged twice"></label>
        <label>Refund <select name="refundType"><option value="full">in full</option><option value="prorated">prorated (a Google Play subscription)</option></select></label>
        <button type="submit" id="refund-button">Refund</button>
        <label>To account <input name="toAccountId" maxlength="256" placeholder="the player's other account"></label>
        <button type="submit" id="transfer-button" formaction="/dashboard/accounts/{{accountPath}}/purchases/transfer">Transfer</button>
        <label>Days <input name="days" type="number" min="1" max="90" value="7"></label>
        <label>Why <select name="extendReason"><option>customer_satisfaction</option><option>service_issue</option><option>other</option><option>undeclared</option></select></label>
        <button type="submit" id="extend-button" formaction="/dashboard/accounts/{{accountPath}}/purchases/extend">Extend</button>
        </form>
        <p class="hint">Refund: Google Play and web purchases (App Store refunds are Apple's: the player asks at reportaproblem.apple.com). Transfer: a non-consumable or subscription. Extend: a subscription (Apple: its renewal date; Google Play: deferred).</p>
        {{/hasPurchases}}
        {{/canSupport}}
        </section>
        <section id="grants"><h2>Grants</h2>
        {{^hasGrants}}<p class="empty">No grants.</p>{{/hasGrants}}
        {{#hasGrants}}<table id="grants-table"><thead><tr><th>Entitlement</th><th>Granted</th><th>Until</th><th>State</th><th>Note</th><th></th></tr></thead>
        <tbody>{{#grants}}<tr data-grant="{{grantId}}"><td>{{entitlement}}</td><td>{{createdAt}}</td><td>{{expiresAt}}</td><td>{{state}}</td><td>{{note}}</td>
        <td>{{#running}}{{#canSupport}}<form method="post" action="/dashboard/accounts/{{accountPath}}/grants/{{grantId}}/end"><input type="hidden" name="_csrf" value="{{csrf}}"><button type="submit">End</button></form>{{/canSupport}}{{/running}}</td></tr>{{/grants}}</tbody></table>{{/hasGrants}}
        </section>
        <section id="refunds"><h2>Refunds</h2>
        <p class="hint">App Store refunds are Apple's to grant: send the player to <a href="https://reportaproblem.apple.com" rel="noreferrer">reportaproblem.apple.com</a>; Apple's answer appears here. Google Play and web purchases are refunded with the Support form above (or <code>POST /v1/transactions/{id}/refund</code>).</p>
        {{^hasRefunds}}<p class="empty">No refunds or refund requests.</p>{{/hasRefunds}}
        {{#hasRefunds}}<table id="refunds-table"><thead><tr><th>When</th><th>Store</th><th>Transaction</th><th>Product</th><th>Event</th><th>Detail</th></tr></thead>
        <tbody>{{#refunds}}<tr><td>{{at}}</td><td>{{store}}</td><td><code>{{transactionId}}</code></td><td>{{productId}}</td><td>{{event}}</td><td>{{detail}}</td></tr>{{/refunds}}</tbody></table>{{/hasRefunds}}
        </section>
        <section id="notes"><h2>Notes</h2>
        {{#canSupport}}<form class="support" id="note-form" method="post" action="/dashboard/accounts/{{accountPath}}/note">
        <input type="hidden" name="_csrf" value="{{csrf}}">
        <label>Note <input name="text" required maxlength="2000" placeholder="promised 100 coins if the outage repeats"></label>
        <label>Ticket <input name="ticket" maxlength="100" placeholder="ZD-4411"></label>
        <button type="submit">Add note</button>
        </form>{{/canSupport}}
        {{^hasNotes}}<p class="empty">No notes yet.</p>{{/hasNotes}}
        {{#hasNotes}}<table id="notes-table"><thead><tr><th>When</th><th>By</th><th>Ticket</th><th>Note</th></tr></thead>
        <tbody>{{#notes}}<tr><td>{{createdAt}}</td><td>{{author}}</td><td>{{ticket}}</td><td class="note-text">{{text}}</td></tr>{{/notes}}</tbody></table>{{/hasNotes}}
        </section>
        <section>
        <h2>Entitlements</h2>
        {{^entitlements}}<p class="empty">No entitlements.</p>{{/entitlements}}
        {{#hasEntitlements}}<table><thead><tr><th>Entitlement</th><th>Active</th><th>Product</th><th>Store</th><th>Source</th><th>Expires</th></tr></thead>
        <tbody>{{#entitlements}}<tr><td>{{id}}</td><td>{{active}}</td><td>{{productId}}</td><td>{{store}}</td><td>{{source}}</td><td>{{expiresAt}}</td></tr>{{/entitlements}}</tbody></table>{{/hasEntitlements}}
        </section>
        <section>
        <h2>Subscriptions</h2>
        {{^subscriptions}}<p class="empty">No subscriptions.</p>{{/subscriptions}}
        {{#subscriptions}}
        <article class="subscription">
        <h3>{{productId}} <span class="status status-{{status}}">{{status}}</span></h3>
        <p>{{store}} · app {{appId}} · original transaction {{originalTransactionId}} · expires {{expiresAt}} · auto-renew {{autoRenew}}</p>
        {{#hasEvents}}<table><thead><tr><th>Signed</th><th>Notification</th><th>Status</th><th>Outcome</th></tr></thead>
        <tbody>{{#events}}<tr><td>{{signedDate}}</td><td>{{type}} {{subtype}}</td><td>{{status}}</td><td>{{outcome}}</td></tr>{{/events}}</tbody></table>{{/hasEvents}}
        </article>
        {{/subscriptions}}
        </section>
        <section>
        <h2>Orders</h2>
        {{^orders}}<p class="empty">No orders.</p>{{/orders}}
        {{#hasOrders}}<table><thead><tr><th>Created</th><th>Order</th><th>Product</th><th class="num">Quantity</th><th>Status</th><th>Transaction</th><th>Store</th><th>App</th></tr></thead>
        <tbody>{{#orders}}<tr><td>{{createdAt}}</td><td>{{orderId}}</td><td>{{productId}}</td><td class="num">{{quantity}}</td><td>{{status}}</td><td>{{transactionId}}</td><td>{{store}}</td><td>{{appId}}</td></tr>{{/orders}}</tbody></table>{{/hasOrders}}
        </section>
        <section>
        <h2>Ledger</h2>
        {{^ledger}}<p class="empty">No ledger entries.</p>{{/ledger}}
        {{#hasLedger}}<table id="ledger"><thead><tr><th>When</th><th>Entry</th><th>Currency</th><th class="num">Amount</th><th>Reason</th></tr></thead>
        <tbody>{{#ledger}}<tr><td>{{createdAt}}</td><td>{{entryKey}}</td><td>{{currency}}</td><td class="num">{{amount}}</td><td>{{reason}}</td></tr>{{/ledger}}</tbody></table>{{/hasLedger}}
        </section>
        <section>
        <h2>Audit</h2>
        {{^audit}}<p class="empty">No audit entries.</p>{{/audit}}
        {{#hasAudit}}<table id="audit"><thead><tr><th>When</th><th>Actor</th><th>Action</th><th>Subject</th><th>Detail</th></tr></thead>
        <tbody>{{#audit}}<tr data-action="{{action}}"><td>{{createdAt}}</td><td>{{actor}}</td><td>{{action}}</td><td>{{subject}}</td><td>{{detail}}</td></tr>{{/audit}}</tbody></table>{{/hasAudit}}
        </section>
        """

    static let webhooks = """
        <h1>Webhooks</h1>
        {{^configured}}<p class="error" role="status">No webhook URL is configured (<code>webhooks.url</code>): events are kept in the outbox and nothing is sent. Set <code>webhooks.url</code> and <code>webhooks.secret</code> to deliver them to your back end.</p>{{/configured}}
        {{#configured}}<p>Sending to <code>{{url}}</code>.</p>{{/configured}}
        <p>{{pending}} event(s) waiting to be sent. Events the back end refused for <code>webhooks.maxAttemptHours</code> are dead letters: replay one to queue it again.</p>
        {{^letters}}<p class="empty">No dead letters.</p>{{/letters}}
        {{#hasLetters}}<table id="dead-letters"><thead><tr><th>Event</th><th>Type</th><th>Created</th><th>Dead since</th><th class="num">Attempts</th><th>Last error</th><th></th></tr></thead>
        <tbody>{{#letters}}<tr id="letter-{{id}}"><td><code>{{id}}</code></td><td>{{type}}</td><td>{{createdAt}}</td><td>{{deadAt}}</td><td class="num">{{attempts}}</td><td>{{lastError}}</td>
        <td>{{#canSupport}}<form method="post" action="/dashboard/webhooks/dead-letters/{{id}}/replay"><input type="hidden" name="_csrf" value="{{csrf}}"><button type="submit">Replay</button></form>{{/canSupport}}</td></tr>{{/letters}}</tbody></table>{{/hasLetters}}
        """

    static let message = """
        <h1>{{heading}}</h1>
        <p class="error" role="alert">{{message}}</p>
        {{#link}}<p><a href="{{link}}">{{linkText}}</a></p>{{/link}}
        """

    static let stylesheet = """
        :root { --ink: #1d2330; --muted: #5b6475; --line: #d9dde5; --accent: #2457c5; --bad: #b3261e; --ok: #1e7b34; --bg: #f6f7f9; }
        * { box-sizing: border-box; }
        body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink); background: var(--bg); }
        header { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; padding: .6rem 1.2rem; background: #fff; border-bottom: 1px solid var(--line); }
        header nav a { margin-right: .8rem; color: var(--ink); text-decoration: none; }
        header nav a[aria-current] { color: var(--accent); font-weight: 600; }
        .brand { font-weight: 700; color: var(--ink); text-decoration: none; }
        .search { display: flex; gap: .4rem; flex: 1; }
        form.support { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin: .4rem 0 .8rem; }
        form.support input, form.support select { max-width: 100%; min-width: 0; }
        main section, main article { overflow-x: auto; }
        code { overflow-wrap: anywhere; }
        @media (max-width: 600px) { .search input { min-width: 0; } main { padding: .8rem .6rem 2rem; } }
        form.support label { display: flex; flex-direction: column; font-size: .85rem; color: var(--muted); }
        .search input { flex: 1; min-width: 12rem; }
        main { max-width: 1100px; margin: 0 auto; padding: 1rem 1.2rem 3rem; }
        input, button { font: inherit; padding: .35rem .55rem; border: 1px solid var(--line); border-radius: 6px; }
        button { background: var(--accent); color: #fff; border-color: var(--accent); cursor: pointer; }
        button.secondary { background: #fff; color: var(--ink); border-color: var(--line); }
        button.link { background: none; border: none; color: var(--accent); padding: 0; }
        .login { display: grid; gap: .5rem; max-width: 24rem; }
        .hint, .empty, small { color: var(--muted); }
        .error { color: var(--bad); font-weight: 600; }
        .flash { background: #e8f3ea; border: 1px solid #b9dcc0; padding: .5rem .8rem; border-radius: 6px; }
        .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(10rem, 1fr)); gap: .8rem; margin-bottom: 1.2rem; }
        .card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: .8rem; display: flex; flex-direction: column; color: var(--ink); text-decoration: none; }
        .figure { font-size: 1.6rem; font-weight: 700; }
        .chart-box { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: .8rem; margin: 0 0 1rem; }
        .chart { width: 100%; height: auto; }
        .chart .grid { stroke: #eceef2; }
        .chart .axis-line { stroke: var(--muted); }
        .chart .axis { font-size: 11px; fill: var(--muted); }
        .chart .chart-title { font-size: 13px; font-weight: 600; fill: var(--ink); }
        .chart .s1 { fill: #2457c5; } .chart .s2 { fill: #d0592c; } .chart .s3 { fill: #1e7b34; } .chart .s4 { fill: #8a3fb8; }
        table { border-collapse: collapse; width: 100%; background: #fff; margin: .4rem 0 1rem; }
        th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
        .num { text-align: right; font-variant-numeric: tabular-nums; }
        .anomaly, .subscription { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: .6rem .9rem; margin-bottom: .8rem; }
        .anomaly h2 { font-size: 1rem; margin: .2rem 0; }
        dl { display: grid; grid-template-columns: max-content 1fr; gap: .1rem .8rem; }
        dt { color: var(--muted); }
        dd { margin: 0; }
        .actions { display: flex; flex-wrap: wrap; gap: 1rem; }
        .actions form { display: flex; flex-wrap: wrap; gap: .4rem; align-items: end; }
        .status-active, .status-grace_period { color: var(--ok); } .status-revoked, .status-expired, .status-billing_retry { color: var(--bad); }
        .tabs a { margin-right: .8rem; } .tabs a[aria-current] { font-weight: 600; }
        """
}
