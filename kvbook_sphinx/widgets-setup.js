// kvbook: prepares a page for the ipywidgets HTML manager that the book serves itself
// (_static/offline/, copied there by kvbook_sphinx). Loaded before require.js on widget pages.
(function () {
  // embed-amd.js defines AMD modules named "@jupyter-widgets/..." and each one fetches its Font
  // Awesome files next to the URL RequireJS gives its name; map those names to our folder.
  // (A global `require` object defined before require.js loads is its configuration.)
  var folder = new URL("html-manager", document.currentScript.src).href;
  window.require = {paths: {"@jupyter-widgets": folder, "@jupyter-widgets/html-manager/dist": folder}};
  // ipywidgets typesets widget labels with the MathJax 2 call MathJax.Hub.Queue; the book loads
  // MathJax 3, which has no Hub, so route that call to MathJax 3's typesetPromise.
  window.addEventListener("load", function () {
    var mathjax = window.MathJax;
    if (mathjax && mathjax.startup && !mathjax.Hub) {
      mathjax.Hub = {
        Queue: function (job) {
          var element = job && job[2];
          return mathjax.startup.promise.then(function () {
            return mathjax.typesetPromise(element ? [element] : undefined);
          });
        }
      };
    }
  });
})();
