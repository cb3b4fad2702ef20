// Browser tests of the web console, run by tests/console.rs against a broker on Apache Kafka:
// playwright-core drives Debian's Chromium (no browser download). The Rust test seeds the
// records, runs this with what it needs in the environment, and checks on Kafka what the
// clicks did. Each step prints one line; the outcome goes to $CONSOLE_RESULT as JSON.
//
//   CONSOLE_PHASE        open (no token) or token (the broker has --admin-token)
//   CONSOLE_URL          http://127.0.0.1:PORT
//   CONSOLE_IDS          JSON: the seeded records' delay-ids and ids, by role
//   CONSOLE_TOKEN        the token (phase token)
//   CONSOLE_SCREENSHOTS  directory for the screenshots
//   CONSOLE_RESULT       file for the outcome
//   CHROMIUM             the browser (default /usr/bin/chromium)
import { chromium } from "playwright-core";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const base = env("CONSOLE_URL");
const phase = env("CONSOLE_PHASE");
const shots = env("CONSOLE_SCREENSHOTS");
const ids = JSON.parse(process.env.CONSOLE_IDS || "{}");
const result = { steps: [], dialogs: [], screenshots: [] };

function check(ok, what) {
  if (!ok) throw new Error("failed: " + what);
  passed(what);
}

/** A step whose check was the wait before it (a timeout throws). */
function passed(what) {
  result.steps.push(what);
  console.log("ok  " + what);
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, name + ".png"), fullPage: false });
  result.screenshots.push(name + ".png");
}

/** Clicks an action button and confirms it in the page's dialog; returns when it was confirmed. */
async function confirmed(page, button) {
  await page.click(button);
  await page.waitForSelector("dialog#confirm[open]");
  const question = await page.textContent("#confirm-text");
  const at = Date.now();
  await page.click("#confirm-yes");
  await page.waitForSelector("#outcome:not([hidden])");
  return { question, at, outcome: await page.textContent("#outcome") };
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"],
  headless: true,
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  // A record's key, value or headers must never run: any alert fails the test.
  page.on("dialog", async (d) => {
    result.dialogs.push(d.message());
    await d.dismiss();
  });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));

  if (phase === "open") {
    // First, so that it is cancelled long before it is due.
    await page.goto(base + `/ui#/record/${ids.cancel}`);
    await page.waitForSelector("#record-cancel");
    const cancel = await confirmed(page, "#record-cancel");
    check(cancel.question.includes("Cancel record " + ids.cancel), "cancel asks first");
    check(cancel.outcome.includes("Cancelled " + ids.cancel), "cancel shows its outcome");
    result.cancelled_at = cancel.at;

    await page.goto(base + "/ui#/");
    await page.waitForSelector("text=Pending by target");
    check((await page.textContent("main")).includes(ids.target), "overview lists the target with pending records");
    await shot(page, "overview");

    // Search by delay-id finds the one record.
    await page.goto(base + "/ui#/pending");
    await page.fill("#pending-search input[name=delay_id]", ids.find_delay_id);
    await page.click("#pending-search button[type=submit]");
    await page.waitForSelector(`tr[data-id="${ids.find}"]`);
    const rows = await page.$$("tbody tr[data-id]");
    check(rows.length === 1, "search by delay-id finds exactly that record");
    await shot(page, "pending");

    // Its page: key, value and headers.
    await page.click(`tr[data-id="${ids.find}"] a`);
    await page.waitForSelector("#record-cancel");
    check((await page.textContent("dl.detail")).includes(ids.find_key), "the record page shows its key");
    await page.click("button[data-mode=JSON]");
    check((await page.textContent("#value")).includes('"order": 42'), "the value is shown as JSON");
    await page.click("button[data-mode=Hex]");
    check((await page.textContent("#value")).startsWith("7b"), "the value is shown as hex");

    // Markup in a record is shown as text and runs nothing.
    // (A new hash on the same page: the record shown before stays until this one renders, so
    // wait for this one's key, shown as text, before reading its value.)
    await page.goto(base + `/ui#/record/${ids.script}`);
    await page
      .waitForFunction(() => (document.querySelector("dl.detail")?.textContent || "").includes("<img src=x"), null, { timeout: 15000 })
      .catch(() => {});
    await page.waitForSelector("#value");
    const shown = await page.textContent("#value");
    check(shown === "<script>alert(1)</script>", "a value of <script>alert(1)</script> is shown as text");
    check((await page.textContent("dl.detail")).includes("<img src=x onerror=alert(2)>"), "a key holding markup is shown as text");
    check((await page.$$("main script, main img")).length === 0, "no element was made from the record's markup");
    await shot(page, "record");

    // Fire now from the page.
    await page.goto(base + `/ui#/record/${ids.fire}`);
    await page.waitForSelector("#record-fire");
    const fire = await confirmed(page, "#record-fire");
    check(fire.outcome.includes("Fired " + ids.fire), "fire now shows its outcome");
    result.fired_at = fire.at;

    // Bulk: reschedule everything of the bulk target by an hour, after confirmation.
    await page.goto(base + "/ui#/pending?target=" + encodeURIComponent(ids.bulk_target));
    await page.waitForSelector("#bulk-reschedule");
    await page.fill("#bulk-delay", "2h");
    const bulk = await confirmed(page, "#bulk-reschedule");
    check(/Rescheduled 3 of 3/.test(bulk.outcome), "a bulk reschedule for a filter changes the 3 matching records");

    // A dead letter replayed at a rate.
    await page.goto(base + "/ui#/dead-letters");
    await page.waitForSelector(`a[href="#/dead-letters/${encodeURIComponent(ids.dead_topic)}"]`);
    await shot(page, "dead-letter-topics");
    await page.goto(base + `/ui#/dead-letters/${encodeURIComponent(ids.dead_topic)}?reason=missing-target`);
    await page.waitForSelector("tbody tr[data-offset]");
    check((await page.textContent("main table")).includes("missing-target"), "dead letters show their reason code");
    await page.fill("#replay-to", ids.target);
    await page.fill("#replay-rate", "5/s");
    const replay = await confirmed(page, "#replay");
    check(replay.outcome.includes("started"), "a replay starts from the page");
    await page.waitForFunction(() => document.querySelector("tr[data-replay] .state")?.textContent.startsWith("done"), null, { timeout: 30000, polling: 500 })
      .catch(async () => {
        await page.reload();
        await page.waitForFunction(() => document.querySelector("tr[data-replay] .state")?.textContent.startsWith("done"), null, { timeout: 30000, polling: 500 });
      });
    passed("the replay is shown as done");
    await shot(page, "dead-letters");

    // Recently fired shows the record fired from the page.
    await page.goto(base + "/ui#/fired?delay_id=" + encodeURIComponent(ids.fire_delay_id));
    await page.waitForSelector(`tr[data-id="${ids.fire}"]`, { timeout: 15000 }).catch(async () => {
      await page.reload();
      await page.waitForSelector(`tr[data-id="${ids.fire}"]`, { timeout: 15000 });
    });
    await page.goto(base + "/ui#/fired");
    await page.waitForSelector(`tr[data-id="${ids.fire}"]`);
    passed("recently fired lists the record fired from the page");
    await shot(page, "fired");

    // A page of another origin cannot act: its request is refused (or never sent). The same
    // server under another name is another origin (and, being loopback too, the browser
    // sends its requests: a public page's would not even leave the browser).
    const evil = await context.newPage();
    await evil.goto(base.replace("127.0.0.1", "localhost") + "/healthz");
    const attempts = await evil.evaluate(async ({ base, id }) => {
      const out = [];
      for (const [method, path, init] of [
        ["POST", `/api/v1/pending/${id}/fire`, { mode: "no-cors", body: "{}", headers: { "Content-Type": "text/plain" } }],
        ["POST", "/api/v1/bulk/cancel", { mode: "no-cors", body: '{"all":true}', headers: { "Content-Type": "text/plain" } }],
        ["DELETE", `/api/v1/pending/${id}`, { mode: "cors" }],
      ]) {
        try {
          const r = await fetch(base + path, { method, ...init });
          out.push(method + " " + path + ": " + r.type + " " + r.status);
        } catch (e) {
          out.push(method + " " + path + ": blocked (" + e.message + ")");
        }
      }
      return out;
    }, { base, id: ids.find });
    result.cross_origin = attempts;
    // The browser lets such a page read no answer: each attempt is opaque or blocked. What the
    // server did with the ones it received is checked on Kafka by the Rust test.
    check(
      attempts.length === 3 && attempts.every((a) => / opaque 0$| blocked /.test(a)),
      "a page of another origin can send but read nothing: " + attempts.join("; "),
    );
  } else if (phase === "token") {
    const token = env("CONSOLE_TOKEN");
    await page.goto(base + "/ui#/pending");
    await page.waitForSelector("#token-form");
    check(!(await page.textContent("main")).includes(ids.target), "without the token the page shows no record");
    await shot(page, "token");
    // Without the token the page's own requests are refused.
    const refused = await page.evaluate(async (id) => {
      const a = await fetch("/api/v1/pending");
      const b = await fetch(`/api/v1/pending/${id}/fire`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
      const c = await fetch(`/api/v1/pending/${id}`, { method: "DELETE" });
      return [a.status, b.status, c.status];
    }, ids.find);
    check(refused.every((s) => s === 401), "without the token reading, firing and cancelling answer 401");
    // A wrong token is refused too.
    // The prompt on the page now is marked: the one the refusal brings back is a new one (else
    // the right token below races the wrong one's answer).
    await page.fill("#token", "wrong-token-wrong-token");
    await page.evaluate(() => { document.getElementById("token-form").dataset.old = "1"; });
    await page.click("#token-form button[type=submit]");
    await page.waitForSelector("#token-form:not([data-old])");
    passed("a wrong token brings the prompt back");
    await page.fill("#token", token);
    await page.click("#token-form button[type=submit]");
    await page.waitForSelector(`tr[data-id="${ids.find}"]`);
    passed("with the token the pending records show");
  }
  check(errors.length === 0, "no script error on any page: " + errors.join("; "));
  check(result.dialogs.length === 0, "no alert ran");
  await browser.close();
  writeFileSync(env("CONSOLE_RESULT"), JSON.stringify(result, null, 2));
} catch (e) {
  console.error(String(e && e.stack ? e.stack : e));
  result.error = String(e);
  try {
    writeFileSync(env("CONSOLE_RESULT"), JSON.stringify(result, null, 2));
  } catch (_) {}
  await browser.close();
  process.exit(1);
}
