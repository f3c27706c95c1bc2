// The player of the book's animations (tools/animations/): frames recorded from real runs,
// each a picture and a line of narration. Buttons and keys: Space plays or pauses, the arrow
// keys step, Home and End jump to the first and the last frame.
(function () {
  "use strict";

  function setUp(root) {
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    const data = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    const frames = data.frames;
    const stage = root.querySelector(".book-animation-stage");
    const narration = root.querySelector(".book-animation-narration");
    const counter = root.querySelector(".book-animation-counter");
    const play = root.querySelector("[data-act='play']");
    let index = 0;
    let timer = null;

    function show(i) {
      index = Math.max(0, Math.min(frames.length - 1, i));
      stage.innerHTML = frames[index].svg;
      narration.textContent = frames[index].narration;
      counter.textContent = (index + 1) + " / " + frames.length;
      root.dataset.frame = String(index + 1);
    }
    function pause() {
      if (timer !== null) clearInterval(timer);
      timer = null;
      play.textContent = "▶ play";
      play.setAttribute("aria-pressed", "false");
    }
    function start() {
      if (index === frames.length - 1) show(0);
      play.textContent = "⏸ pause";
      play.setAttribute("aria-pressed", "true");
      timer = setInterval(function () {
        if (index >= frames.length - 1) pause();
        else show(index + 1);
      }, 1000 * (data.seconds_per_frame || 3));
    }
    const actions = {
      first: function () { pause(); show(0); },
      prev: function () { pause(); show(index - 1); },
      next: function () { pause(); show(index + 1); },
      last: function () { pause(); show(frames.length - 1); },
      play: function () { if (timer === null) start(); else pause(); },
    };
    root.querySelectorAll("button[data-act]").forEach(function (button) {
      button.addEventListener("click", actions[button.dataset.act]);
    });
    root.addEventListener("keydown", function (event) {
      const act = { " ": "play", ArrowLeft: "prev", ArrowRight: "next", Home: "first", End: "last" }[event.key];
      if (!act || (act === "play" && event.target.tagName === "BUTTON")) return;  // a button's own Space
      event.preventDefault();
      actions[act]();
    });
    root.dataset.frames = String(frames.length);
    show(0);
  }

  function setUpAll() {
    document.querySelectorAll(".book-animation").forEach(setUp);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUpAll);
  else setUpAll();
})();
