"""The API's views: each validates its input, hands over to one function, and serializes the answer."""
