// Keeps what the reader holds while a section refreshes itself in place.
//
// Focus: htmx gives it back to the element of the same id after an outerHTML swap,
// so every link in a refreshing section has an id (templates/nodes/*.html).
// Selection: text selected in a section would vanish with the section, so while a
// selection touches a polling section, its polls are skipped; the next poll after
// the selection ends brings it up to date.
(function () {
  "use strict";

  function holdsSelection(element) {
    const selection = window.getSelection();
    if (!selection || selection.isCollapsed || !selection.rangeCount) return false;
    for (let i = 0; i < selection.rangeCount; i++) {
      if (selection.getRangeAt(i).intersectsNode(element)) return true;
    }
    return false;
  }

  document.addEventListener("htmx:beforeRequest", (event) => {
    const element = event.detail.elt;
    if (element && element.hasAttribute("hx-trigger") && element.getAttribute("hx-trigger").includes("every") && holdsSelection(element)) {
      event.preventDefault();
    }
  });
})();
