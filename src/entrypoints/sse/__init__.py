"""The Server-Sent Events adapter: turns an application subscription into an event stream."""
