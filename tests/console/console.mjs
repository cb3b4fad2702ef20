// Browser tests of the web console, run by tests/console.rs against a broker on Apache Kafka:
// playwright-core drives Debian's Chromium (no browser download). The Rust test seeds the
// records, runs this with what it needs in the environment, and checks on Kafka what the
// clicks did. Each step prints one line; the outcome goes to $CONSOLE_RESULT as JSON.
//
//   CONSOLE_PHASE        open (no token), token (the broker has --admin-token), group or
//                        group-partial (three instances, one of them stopped in the second)
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
  return { question, ...(await answeredYes(page)) };
}

/** Says yes to the open confirmation and waits for the action's outcome. */
async function answeredYes(page) {
  // The outcome of an earlier action may still be on screen: wait for this one's.
  const before = await page.evaluate(() => {
    const o = document.querySelector("#outcome");
    return o && !o.hidden ? o.textContent : null;
  });
  const at = Date.now();
  await page.click("#confirm-yes");
  await page.waitForFunction(
    (b) => {
      const o = document.querySelector("#outcome");
      return o && !o.hidden && o.textContent !== b;
    },
    before,
    { timeout: 15000 },
  );
  return { at, outcome: await page.textContent("#outcome") };
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
    // The unfiltered page may still be on screen when the record shows: wait for the answer
    // to the search (a page of one row, that record), or fail at the timeout.
    const found = await page
      .waitForFunction(
        (id) => {
          const rows = document.querySelectorAll("tbody tr[data-id]");
          return rows.length === 1 && rows[0].dataset.id === id;
        },
        ids.find,
        { timeout: 15000 },
      )
      .then(() => true, () => false);
    check(found, "search by delay-id finds exactly that record");
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
    // The page may render again (a reload owed to the action before) and empty a form filled
    // before it: fill until the question asks about the delay typed, answering no otherwise.
    let bulk = { outcome: "no question asked about 2h" };
    for (let tries = 0; tries < 5; tries++) {
      await page.waitForSelector("#bulk-delay");
      await page.fill("#bulk-delay", "2h");
      await page.click("#bulk-reschedule");
      await page.waitForSelector("dialog#confirm[open]");
      if ((await page.textContent("#confirm-text")).includes(" to 2h from now")) {
        bulk = await answeredYes(page);
        break;
      }
      await page.click("#confirm-no");
      await page.waitForTimeout(300);
    }
    check(/Rescheduled 3 of 3/.test(bulk.outcome), "a bulk reschedule for a filter changes the 3 matching records (" + bulk.outcome + ")");

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
  } else if (phase === "group" || phase === "group-partial") {
    // Three instances; the page talks to one. Its overview is the group's: the totals sum
    // every member (ids.pending, what their metrics say), and each member has a row.
    await page.goto(base + "/ui#/");
    await page.waitForSelector(`text=Overview of the group (${ids.members} instances)`, { timeout: 30000 });
    const pendingCard = await page.evaluate(() => {
      const card = [...document.querySelectorAll(".card")].find((c) => c.querySelector(".label").textContent === "Pending");
      return card ? card.querySelector(".value").textContent : null;
    });
    const rows = await page.$$eval("h2:text('Instances') + table tbody tr", (trs) => trs.map((tr) => [tr.className, tr.textContent]));
    check(rows.length === ids.members, `the instances table has a row for each of the ${ids.members} members`);
    if (phase === "group") {
      check(pendingCard === ids.pending, `the pending total is the sum of the members' (${pendingCard}, want ${ids.pending})`);
      check((await page.$("#partial")) === null && rows.every(([c]) => c !== "missing"), "every member answered");
      await shot(page, "group");
      // A search finds the records of every instance on one page, in due order.
      await page.goto(base + `/ui#/pending?due_from=${ids.search_from}&due_to=${ids.search_to}`);
      await page.waitForFunction((n) => document.querySelectorAll("table tbody tr[data-id]").length === n && document.querySelector("#bulk-cancel"), ids.search_count, { timeout: 30000 });
      const found = await page.$$eval("table tbody tr[data-id]", (trs) => trs.map((tr) => [tr.children[1].textContent, tr.children[4].textContent]));
      const holders = new Set(found.map(([, by]) => by));
      check(holders.size === ids.members, `one page of the search holds the records of all ${ids.members} instances: ` + [...holders].join(", "));
      check(found.every(([due], i) => i === 0 || found[i - 1][0] <= due), "in due order");
      await shot(page, "group-pending");
      // Paging through the whole group returns every pending record once.
      const sources = new Set();
      let [listed, first, href] = [0, null, "#/pending"];
      for (let i = 0; i < 100 && href; i++) {
        await page.goto(base + "/ui" + href);
        // The new page is on screen: no search's bulk actions, and another first record.
        await page.waitForFunction((prev) => {
          const td = document.querySelector("table tbody tr[data-id] td:nth-child(4)");
          return td && td.textContent !== prev && !document.querySelector("#bulk-cancel");
        }, first, { timeout: 30000 });
        const shown = await page.$$eval("table tbody tr[data-id]", (trs) => trs.map((tr) => tr.children[3].textContent));
        shown.forEach((s) => sources.add(s));
        [listed, first] = [listed + shown.length, shown[0]];
        href = await page.evaluate(() => document.querySelector("#next-page")?.getAttribute("href") || null);
      }
      check(listed === Number(ids.pending) && sources.size === listed, `paging through lists each of the ${ids.pending} records once (${listed} rows, ${sources.size} distinct)`);
      // A bulk cancel from this one instance cancels the matching records on all of them.
      await page.goto(base + `/ui#/pending?due_from=${ids.cancel_due}&due_to=${ids.cancel_due}`);
      await page.waitForFunction((n) => document.querySelectorAll("table tbody tr[data-id]").length === n && document.querySelector("#bulk-cancel"), ids.cancel_count, { timeout: 30000 });
      const bulk = await confirmed(page, "#bulk-cancel");
      const want = `Cancelled ${ids.cancel_count} of ${ids.cancel_count} on ${ids.members} of ${ids.members} instances`;
      check(bulk.outcome.includes(want), `the bulk cancel reports every instance: ${bulk.outcome} (want ${want})`);
      await page.goto(base + "/ui#/pending");
      await page.waitForFunction(() => document.querySelectorAll("table tbody tr[data-id]").length === 50 && !document.querySelector("#bulk-cancel"), null, { timeout: 30000 });
      // A record another instance holds opens here (by its ref, sent on to its owner).
      const other = await page.$$eval("table tbody tr[data-id]", (trs, asked) => {
        const tr = trs.find((t) => t.querySelector("td.address").textContent !== asked);
        return tr ? [tr.querySelector("a").getAttribute("href"), tr.querySelector("td.address").textContent] : null;
      }, ids.asked);
      check(other !== null, "a record held by another instance is listed");
      await page.goto(base + "/ui" + other[0]);
      await page.waitForSelector("#record-cancel");
      const owner = await page.$$eval("dl.detail dt", (dts) => dts.find((d) => d.textContent === "Owner").nextElementSibling.textContent);
      check(owner === other[1], "its page names the instance holding it (" + owner + ", want " + other[1] + ")");
    } else {
      const partial = await page.textContent("#partial");
      check(partial.includes(ids.missing), "the page names the member that did not answer: " + partial);
      check(rows.some(([c, text]) => c === "missing" && text.includes(ids.missing)), "its row is marked");
      check(pendingCard === ids.pending, `the total covers the members that answered (${pendingCard}, want ${ids.pending})`);
      await shot(page, "group-partial");
      await page.goto(base + "/ui#/pending");
      await page.waitForSelector(`text=Pending records of the group (${ids.members} instances)`, { timeout: 30000 });
      const listing = await page.textContent("#partial");
      check(listing.includes(ids.missing) && listing.includes("not listed"), "the pending page names the member whose records it could not list: " + listing);
      const by = await page.$$eval("table tbody tr[data-id] td.address", (tds) => tds.map((t) => t.textContent));
      check(by.length > 0 && by.every((b) => b !== ids.missing), "and shows the others' records (" + new Set(by).size + " instances)");
    }
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
