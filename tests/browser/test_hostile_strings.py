"""Agent strings that fight the layout, in a real Chromium: a right-to-left override
(U+202E) and a 256-character word with nowhere to break.

An override left open reverses the page's own text after it ("16 logical" read
"lacigol 61"); an unbreakable word widened the cluster page to 4,610 px. Every agent
string must sit in an element that isolates it, and the pages must keep to the
viewport's width.
"""

from __future__ import annotations

import pytest

from agent import protocol
from inventory.models import Allocation, Node
from tests.agentapi import JOIN_TOKEN, a_load, heartbeat, post
from tests.browser.conftest import log_in
from tests.factories import make_inventory

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RLO = "\u202e"
# 250 unbroken characters: with the prefixes below, each string stays within the protocol's 256.
WORD = "W" * 250
HOSTILE = RLO + WORD


def hostile_inventory() -> protocol.Inventory:
    inventory = make_inventory(
        f"{RLO}host{WORD}",
        gpus=2,
        gpu_name=f"{RLO}gpu{WORD}",
        labels={"rack": HOSTILE},
        engine_versions={f"{RLO}engine": HOSTILE},
        engines_probed=True,
        provision=[protocol.EngineInstall(engine=f"{RLO}vllm", version=HOSTILE, state="failed", detail=HOSTILE)],
        weights=[protocol.Weights(path=f"/models/{HOSTILE}")],
        weights_scanned=True,
        filesystems=[protocol.Filesystem(mount=f"/mnt/{HOSTILE}", fstype=HOSTILE, total_bytes=10, free_bytes=5)],
        fabrics=[protocol.Fabric(name=HOSTILE, hcas=[HOSTILE])],
        mgmt_addr=HOSTILE,
    )
    # Short, so that the line it shares with "16 logical" is one line to measure.
    inventory.host.cpu_model = f"{RLO}EPYC"
    inventory.host.cpus = 16
    inventory.host.os = HOSTILE
    inventory.host.kernel = HOSTILE
    inventory.gpus[0].uuid = HOSTILE
    inventory.gpus[1].uuid = "GPU-evil-1"
    inventory.gpus[1].health = HOSTILE
    return inventory


@pytest.fixture
def hostile_node(client, settings, redis_client):
    """A node that reported all of it through the real agent API, and runs a shard."""
    settings.LLMGW_JOIN_TOKEN = JOIN_TOKEN
    registration = protocol.Register(node_id="evil-1", inventory=hostile_inventory(), inventory_hash="h1")
    response = post(client, "/api/v1/register", registration, JOIN_TOKEN)
    assert response.status_code == 200, response.content
    token = protocol.decode(response.content, protocol.Registered).token
    beat = protocol.Heartbeat(
        inventory_hash="h1",
        load=a_load(),
        shards=[protocol.ShardStatus(shard="evil-shard", state="failed", detail=HOSTILE)],
    )
    assert heartbeat(client, token, beat).status_code == 200
    node = Node.objects.get(pk="evil-1")
    Allocation.objects.create(node=node, shard_id="evil-shard", replica_id="evil-r", model=HOSTILE, memory_gb=1)
    return node


# For each rendered text holding the override: the element that bounds its bidi
# paragraph or isolates it must hold that text and nothing of the page's own.
UNISOLATED = """(marker) => {
  const problems = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.data.includes(marker)) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    // Not rendered: JSON in a <script>, the options of a closed <select>.
    if (range.getClientRects().length === 0) continue;
    let el = node.parentElement;
    while (el) {
      const style = getComputedStyle(el);
      if (["isolate", "isolate-override", "plaintext"].includes(style.unicodeBidi) || style.display !== "inline") break;
      el = el.parentElement;
    }
    if (el.textContent.trim() !== node.data.trim()) problems.push(el.outerHTML.slice(0, 160));
  }
  return problems;
}"""

WIDTH = "() => [document.documentElement.scrollWidth, window.innerWidth]"
# Named in a failure: the elements that reach past the viewport's right edge.
PAST_THE_EDGE = """() => [...document.querySelectorAll("body *")]
  .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 8)
  .map((e) => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}px`)"""


def assert_contained(page) -> None:
    page.wait_for_load_state("load")
    problems = page.evaluate(UNISOLATED, RLO)
    assert problems == []
    scroll_width, viewport = page.evaluate(WIDTH)
    assert scroll_width <= viewport, page.evaluate(PAST_THE_EDGE)


def test_the_cluster_page_isolates_agent_strings_and_keeps_its_width(page, live_server, operator, hostile_node):
    log_in(page, live_server.url, "operator", "operator-pass")
    page.locator("#node-evil-1").wait_for()
    assert_contained(page)
    # The long hostname is cut short in the table; its whole text is one hover away.
    hostname = page.locator("#node-evil-1 td.hostname")
    assert hostname.get_attribute("title") == hostile_node.hostname


def test_the_node_page_isolates_agent_strings_and_keeps_its_width(page, live_server, operator, hostile_node):
    log_in(page, live_server.url, "operator", "operator-pass", path="/nodes/evil-1/")
    page.locator("#node-charts .history-unavailable, #node-charts .chart-grid").first.wait_for()
    assert_contained(page)
    # The issue's own example: after the override, the page's "16 logical" still reads so.
    number_left, word_left = page.evaluate(
        """() => {
          const dd = [...document.querySelectorAll("dd")].find((d) => d.textContent.includes("logical"));
          const walker = document.createTreeWalker(dd, NodeFilter.SHOW_TEXT);
          for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.data.indexOf("16 logical");
            if (at < 0) continue;
            const box = (start, end) => {
              const range = document.createRange();
              range.setStart(node, start);
              range.setEnd(node, end);
              return range.getBoundingClientRect().left;
            };
            return [box(at, at + 2), box(at + 3, at + 10)];
          }
          return null;
        }"""
    )
    assert number_left < word_left


def test_the_admin_change_page_isolates_agent_strings_and_keeps_its_width(page, live_server, operator, hostile_node):
    log_in(page, live_server.url, "operator", "operator-pass", path="/admin/inventory/node/evil-1/change/")
    assert_contained(page)


def test_the_admin_list_keeps_its_width(page, live_server, operator, hostile_node):
    log_in(page, live_server.url, "operator", "operator-pass", path="/admin/inventory/node/")
    assert_contained(page)


def test_the_admin_action_confirmation_isolates_the_hostname(page, live_server, operator, hostile_node):
    log_in(page, live_server.url, "operator", "operator-pass", path="/admin/inventory/node/")
    page.check('input[name="_selected_action"][value="evil-1"]')
    page.select_option('select[name="action"]', "cordon")
    page.click('button[name="index"]')
    page.get_by_text("these nodes").wait_for()
    assert_contained(page)
