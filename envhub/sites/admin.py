"""The shop's admin view: dashboard, orders (with status changes), products (price and stock), customers."""

from __future__ import annotations

import re
import sqlite3

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from envhub.sites.data import ORDER_STATUSES, dollars
from envhub.sites.html import as_int, esc, form_fields, link, page, redirect, session_db, table, url

router = APIRouter(prefix="/admin")
_PRICE = re.compile(r"^\$?\s*(\d{1,6})(?:\.(\d{1,2}))?$")
SAVED = "<p role=\"status\">Saved.</p>"


def nav(request: Request) -> str:
    return (link(request, "/admin", "Dashboard") + link(request, "/admin/orders", "Orders")
            + link(request, "/admin/products", "Products") + link(request, "/admin/customers", "Customers"))


def order_rows(request: Request, orders: list[sqlite3.Row]) -> str:
    rows = [[link(request, f"/admin/orders/{o['id']}", f"#{o['id']}"), esc(o["created"]), esc(o["name"]),
             esc(o["status"]), esc(dollars(o["total_cents"]))] for o in orders]
    return table(["Order", "Date", "Customer", "Status", "Total"], rows)


@router.get("")
async def dashboard(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        orders, products, customers = (db.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0]
                                       for name in ("orders", "products", "customers"))
        pending = db.execute("SELECT COUNT(*) FROM orders WHERE status = 'pending'").fetchone()[0]
    body = (f"<h1>Dashboard</h1><ul><li>Orders: {orders} ({pending} pending)</li><li>Products: {products}</li>"
            f"<li>Customers: {customers}</li></ul>")
    return page("Dashboard / Admin", nav(request), body)


@router.get("/orders")
async def orders(request: Request, status: str = "") -> HTMLResponse:
    with session_db(request) as db:
        where, args = ("WHERE o.status = ?", (status,)) if status in ORDER_STATUSES else ("", ())
        found = db.execute(f"SELECT o.*, c.name FROM orders o JOIN customers c ON c.id = o.customer_id {where} "
                           "ORDER BY o.id DESC", args).fetchall()
    filters = " ".join([link(request, "/admin/orders", "All"),
                        *(link(request, f"/admin/orders?status={s}", s.title()) for s in ORDER_STATUSES)])
    body = f"<h1>Orders</h1><p>Filter: {filters}</p><p>{len(found)} orders</p>" + order_rows(request, found)
    return page("Orders / Admin", nav(request), body)


@router.get("/orders/{order_id}")
async def order(request: Request, order_id: int, saved: int = 0) -> HTMLResponse:
    with session_db(request) as db:
        o = db.execute("SELECT o.*, c.name FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.id = ?",
                       (order_id,)).fetchone()
        if o is None:
            return page("Not found", nav(request), "<h1>Order not found</h1>")
        items = db.execute("SELECT p.name, i.qty, i.price_cents FROM order_items i JOIN products p ON p.sku = i.sku "
                           "WHERE i.order_id = ?", (order_id,)).fetchall()
    options = "".join(f'<option value="{s}"{" selected" if s == o["status"] else ""}>{s.title()}</option>'
                      for s in ORDER_STATUSES)
    form = (f'<form method="post" action="{esc(url(request, f"/admin/orders/{order_id}/status"))}">'
            f'<label>Status <select name="status">{options}</select></label> <button>Update Status</button></form>')
    customer_link = link(request, f"/admin/customers/{o['customer_id']}", o["name"])
    body = (f"<h1>Order #{order_id}</h1>{SAVED if saved else ''}<p>Customer: {customer_link}</p>"
            f"<p>Date: {esc(o['created'])}</p><p>Status: {esc(o['status'])}</p>"
            + table(["Product", "Qty", "Price"], [[esc(i["name"]), str(i["qty"]), esc(dollars(i["price_cents"]))]
                                                 for i in items])
            + f"<p>Total: {esc(dollars(o['total_cents']))}</p>{form}")
    return page(f"Order #{order_id} / Admin", nav(request), body)


@router.post("/orders/{order_id}/status")
async def set_status(request: Request, order_id: int) -> Response:
    status = (await form_fields(request)).get("status", "")
    if status in ORDER_STATUSES:
        with session_db(request) as db:
            db.execute("UPDATE orders SET status = ? WHERE id = ?", (status, order_id))
    return redirect(request, f"/admin/orders/{order_id}?saved=1")


@router.get("/products")
async def products(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        rows = [[esc(p["sku"]), link(request, f"/admin/products/{p['sku']}", p["name"]), esc(dollars(p["price_cents"])),
                 str(p["stock"])] for p in db.execute("SELECT * FROM products ORDER BY sku")]
    return page("Products / Admin", nav(request), "<h1>Products</h1>" + table(["SKU", "Name", "Price", "Stock"], rows))


@router.get("/products/{sku}")
async def product(request: Request, sku: str, saved: int = 0, error: str = "") -> HTMLResponse:
    with session_db(request) as db:
        p = db.execute("SELECT * FROM products WHERE sku = ?", (sku,)).fetchone()
    if p is None:
        return page("Not found", nav(request), "<h1>Product not found</h1>")
    price = f"{p['price_cents'] // 100}.{p['price_cents'] % 100:02d}"
    problem = f'<p role="alert">{esc(error)}</p>' if error else ""
    form = (f'<form method="post" action="{esc(url(request, f"/admin/products/{sku}"))}">'
            f'<label>Price <input type="text" name="price" value="{price}"></label> '
            f'<label>Stock <input type="number" name="stock" value="{p["stock"]}"></label> '
            '<button>Save Product</button></form>')
    body = f"<h1>Edit product: {esc(p['name'])}</h1>{SAVED if saved else ''}{problem}<p>SKU: {esc(sku)}</p>{form}"
    return page(f"{p['name']} / Products / Admin", nav(request), body)


@router.post("/products/{sku}")
async def save_product(request: Request, sku: str) -> Response:
    fields = await form_fields(request)
    match = _PRICE.match(fields.get("price", "").strip())
    if match is None:
        return redirect(request, f"/admin/products/{sku}?error=Price+must+look+like+12.99")
    cents = int(match.group(1)) * 100 + int((match.group(2) or "0").ljust(2, "0"))
    with session_db(request) as db:
        db.execute("UPDATE products SET price_cents = ?, stock = ? WHERE sku = ?",
                   (cents, max(0, as_int(fields.get("stock"), 0)), sku))
    return redirect(request, f"/admin/products/{sku}?saved=1")


@router.get("/customers")
async def customers(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        rows = [[link(request, f"/admin/customers/{c['id']}", c["name"]), esc(c["email"]), esc(c["city"]), str(c["n"])]
                for c in db.execute("SELECT c.*, (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id) AS n "
                                    "FROM customers c ORDER BY c.name")]
    return page("Customers / Admin", nav(request),
                "<h1>Customers</h1>" + table(["Name", "Email", "City", "Orders"], rows))


@router.get("/customers/{customer_id}")
async def customer(request: Request, customer_id: int) -> HTMLResponse:
    with session_db(request) as db:
        c = db.execute("SELECT * FROM customers WHERE id = ?", (customer_id,)).fetchone()
        if c is None:
            return page("Not found", nav(request), "<h1>Customer not found</h1>")
        found = db.execute("SELECT o.*, c.name FROM orders o JOIN customers c ON c.id = o.customer_id "
                           "WHERE o.customer_id = ? ORDER BY o.id DESC", (customer_id,)).fetchall()
    body = (f"<h1>{esc(c['name'])}</h1><p>Email: {esc(c['email'])}</p><p>City: {esc(c['city'])}</p>"
            f"<p>Orders placed: {len(found)}</p>" + order_rows(request, found))
    return page(f"{c['name']} / Customers / Admin", nav(request), body)
