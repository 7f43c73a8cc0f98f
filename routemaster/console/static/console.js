// Live updates for the console's pages: counts, recent changes, the label shown.
// The page works without this; it only follows the changes stream from the
// snapshot the page was read in (data-after, data-seen), so every change is
// applied once: those the snapshot already saw are skipped.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-changes");
  if (!url || !window.EventSource) {
    return;
  }
  var seen = body.getAttribute("data-seen").split(":");
  var xmin = Number(seen[0]);
  var xmax = Number(seen[1]);
  var running = seen[2] ? seen[2].split(",").map(Number) : [];
  var live = document.getElementById("live");

  function alreadyShown(eventId) {
    var xact = Number(eventId.split("-")[0]);
    return xact < xmin || (xact < xmax && running.indexOf(xact) < 0);
  }

  function adjust(machine, state, delta) {
    if (state === null) {
      return;
    }
    var cells = document.querySelectorAll("[data-machine][data-state]");
    for (var i = 0; i < cells.length; i++) {
      var cell = cells[i];
      if (cell.getAttribute("data-machine") === machine && cell.getAttribute("data-state") === state) {
        cell.textContent = String(Number(cell.textContent) + delta);
      }
    }
  }

  function oneMoreErrored(machine, state) {
    var cells = document.querySelectorAll("[data-errored-machine][data-errored-state]");
    for (var i = 0; i < cells.length; i++) {
      var cell = cells[i];
      if (cell.getAttribute("data-errored-machine") === machine &&
          cell.getAttribute("data-errored-state") === state) {
        var target = cell.querySelector("a") || cell;
        target.textContent = String(Number(target.textContent) + 1);
      }
    }
  }

  function describe(change) {
    if (change.kind === "errored") {
      return "errored in " + change.new_state + ": " + change.reason;
    }
    if (change.kind === "created") {
      return "created in " + change.new_state;
    }
    if (change.kind === "deleted") {
      return "deleted (was in " + change.old_state + ")";
    }
    if (change.old_state === change.new_state) {
      return (change.reason || "forced") + " in " + change.new_state;
    }
    var text = change.old_state + " \u2192 " + change.new_state;
    return change.forced ? text + " (forced" + (change.reason ? ": " + change.reason : "") + ")" : text;
  }

  function prepend(change) {
    var list = document.getElementById("changes");
    if (!list) {
      return;
    }
    var empty = list.querySelector(".empty");
    if (empty) {
      list.removeChild(empty);
    }
    var item = document.createElement("li");
    var time = document.createElement("time");
    time.textContent = change.at.substring(11, 19);
    var link = document.createElement("a");
    link.href = "/console/machines/" + encodeURIComponent(change.state_machine) +
      "/labels/" + encodeURIComponent(change.label);
    link.textContent = change.label;
    item.appendChild(time);
    item.appendChild(document.createTextNode(" "));
    item.appendChild(link);
    item.appendChild(document.createTextNode(" " + describe(change)));
    list.insertBefore(item, list.firstChild);
    while (list.children.length > 100) {
      list.removeChild(list.lastChild);
    }
  }

  var source = new EventSource(url + "?after=" + encodeURIComponent(body.getAttribute("data-after")));
  source.onopen = function () {
    if (live) {
      live.textContent = "live";
    }
  };
  source.onerror = function () {
    if (live) {
      live.textContent = "reconnecting\u2026";
    }
  };
  source.onmessage = function (event) {
    if (alreadyShown(event.lastEventId)) {
      return;
    }
    var change = JSON.parse(event.data);
    if (change.kind === "errored") {
      oneMoreErrored(change.state_machine, change.new_state);
    } else {
      adjust(change.state_machine, change.old_state, -1);
      adjust(change.state_machine, change.new_state, +1);
    }
    prepend(change);
    if (body.getAttribute("data-label") === change.label &&
        body.getAttribute("data-machine") === change.state_machine) {
      source.close();
      window.location.reload();
    }
  };
}());
