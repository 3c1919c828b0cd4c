"""The API's shapes: each response is built by one of these, so the OpenAPI document and the answer cannot drift."""
