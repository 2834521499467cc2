// Swagger UI at /docs, started from this file: the page's policy allows no inline script.
"use strict";
window.ui = SwaggerUIBundle({
  url: document.body.dataset.spec,
  dom_id: "#swagger-ui",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  // Its default sends the spec to validator.swagger.io for a badge: nothing leaves this server.
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
