// Opens the viewer in Debian's headless chromium and reports what the page drew and answered.
// usage: node viewer_check.js URL SCREENSHOT QUERY_WORLD X0 Y0 X1 Y1 PICK_X PICK_Y   (JSON on stdout)
const { chromium } = require("playwright-core");
const fs = require("fs"), os = require("os"), path = require("path");

async function main() {
  const [url, shot, qworld, x0, y0, x1, y1, px, py] = process.argv.slice(2);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "sapgrid-chromium-"));
  // a fresh profile directory (playwright passes it as --user-data-dir)
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
    viewport: { width: 1100, height: 700 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const out = {};
  try {
    const page = await browser.newPage();
    page.on("pageerror", (e) => { out.pageErrors = (out.pageErrors || []).concat(String(e)); });
    await page.goto(url);
    // the demo world: boxes and pairs drawn, frames streaming
    await page.waitForFunction(() => {
      const s = window.sapgridViewer.state;
      return s && s.sent > 0 && s.pairs.length > 0 && s.stats && s.stats.fps > 0;
    }, null, { timeout: 30000 });
    await page.waitForTimeout(300);
    out.demo = await page.evaluate(() => {
      const s = window.sapgridViewer.state, c = document.getElementById("canvas");
      const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let blue = 0, orange = 0;
      for (let i = 0; i < d.length; i += 4) {
        if (d[i + 2] > 120 && d[i] < 140) blue++;
        if (d[i] > 200 && d[i + 1] > 100 && d[i + 1] < 200 && d[i + 2] < 100) orange++;
      }
      return { world: s.world, sent: s.sent, total: s.total, pairs: s.pairs.length / 2, stats: s.stats,
               bluePixels: blue, orangePixels: orange, statsText: document.getElementById("stats").textContent };
    });
    await page.screenshot({ path: shot });
    // the query world: pick it, drag a region with shift, click an object
    await page.selectOption("#world", qworld);
    await page.waitForFunction((w) => window.sapgridViewer.state && window.sapgridViewer.state.world === w, qworld);
    const box = await page.locator("#canvas").boundingBox();
    const scr = async (x, y) => {
      const [sx, sy] = await page.evaluate(([x, y]) => window.sapgridViewer.toScreen(x, y), [x, y]);
      return [box.x + sx, box.y + sy];
    };
    const [ax, ay] = await scr(+x0, +y0), [bx, by] = await scr(+x1, +y1);
    await page.keyboard.down("Shift");
    await page.mouse.move(ax, ay); await page.mouse.down();
    await page.mouse.move((ax + bx) / 2, (ay + by) / 2); await page.mouse.move(bx, by); await page.mouse.up();
    await page.keyboard.up("Shift");
    await page.waitForFunction(() => window.sapgridViewer.lastQuery !== null);
    out.query = await page.evaluate(() => window.sapgridViewer.lastQuery);
    out.queryText = await page.textContent("#query");
    const [cx, cy] = await scr(+px, +py);
    await page.mouse.click(cx, cy);
    await page.waitForFunction(() => window.sapgridViewer.lastPick !== null);
    out.pick = await page.evaluate(() => window.sapgridViewer.lastPick);
    out.pickText = await page.textContent("#pick");
  } finally {
    await browser.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  process.stdout.write(JSON.stringify(out));
}
main().catch((e) => { console.error(e); process.exit(1); });
