"""The shop ("One Stop Market"): home, search, categories, product pages, cart, checkout, orders.

The session is logged in as customer 1 (envhub/sites/data.py). Every page reads the session's
own database, so an order placed here shows up in the admin view of the same session only.
"""

from __future__ import annotations

import sqlite3

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from envhub.sites.data import SESSION_CUSTOMER_ID, dollars
from envhub.sites.html import as_int, button_form, esc, form_fields, link, page, redirect, session_db, table, url

router = APIRouter(prefix="/shop")
SHIPPING_CENTS = {"standard": 500, "express": 1500}


def nav(request: Request, db: sqlite3.Connection) -> str:
    items = db.execute("SELECT COALESCE(SUM(qty), 0) FROM cart").fetchone()[0]
    search = (f'<form role="search" method="get" action="{esc(url(request, "/shop/search"))}" style="display:inline">'
              '<input type="search" name="q" aria-label="Search products" placeholder="Search products">'
              '<button>Search</button></form>')
    return (link(request, "/shop", "One Stop Market") + search + link(request, "/shop/cart", f"My Cart ({items})")
            + link(request, "/shop/orders", "My Orders"))


def product_rows(request: Request, products: list[sqlite3.Row]) -> str:
    rows = [[link(request, f"/shop/product/{p['sku']}", p["name"]), esc(dollars(p["price_cents"])),
             esc(f"{p['rating']} stars")] for p in products]
    return table(["Product", "Price", "Rating"], rows)


@router.get("")
async def home(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        categories = db.execute("SELECT slug, name FROM categories ORDER BY name").fetchall()
        body = "<h1>Welcome to One Stop Market</h1><h2>Shop by category</h2><ul>" + "".join(
            f"<li>{link(request, '/shop/category/' + c['slug'], c['name'])}</li>" for c in categories) + "</ul>"
        return page("One Stop Market", nav(request, db), body)


@router.get("/search")
async def search(request: Request, q: str = "") -> HTMLResponse:
    with session_db(request) as db:
        pattern = f"%{q.strip()}%"
        found = db.execute("SELECT * FROM products WHERE name LIKE ? OR description LIKE ? ORDER BY name",
                           (pattern, pattern)).fetchall() if q.strip() else []
        body = f"<h1>Search results for '{esc(q)}'</h1><p>{len(found)} results</p>" + product_rows(request, found)
        return page(f"Search results for: '{q}'", nav(request, db), body)


@router.get("/category/{slug}")
async def category(request: Request, slug: str) -> HTMLResponse:
    with session_db(request) as db:
        row = db.execute("SELECT name FROM categories WHERE slug = ?", (slug,)).fetchone()
        if row is None:
            return page("Not found", nav(request, db), "<h1>Category not found</h1>")
        products = db.execute("SELECT * FROM products WHERE category = ? ORDER BY name", (slug,)).fetchall()
        body = f"<h1>{esc(row['name'])}</h1><p>{len(products)} items</p>" + product_rows(request, products)
        return page(row["name"], nav(request, db), body)


@router.get("/product/{sku}")
async def product(request: Request, sku: str) -> HTMLResponse:
    with session_db(request) as db:
        p = db.execute("SELECT * FROM products WHERE sku = ?", (sku,)).fetchone()
        if p is None:
            return page("Not found", nav(request, db), "<h1>Product not found</h1>")
        stock = f"In stock ({p['stock']} left)" if p["stock"] > 0 else "Out of stock"
        add = (f'<form method="post" action="{esc(url(request, "/shop/cart/add"))}">'
               f'<input type="hidden" name="sku" value="{esc(sku)}"><label>Qty '
               '<input type="number" name="qty" value="1" min="1" max="99"></label> '
               '<button>Add to Cart</button></form>')
        body = (f"<h1>{esc(p['name'])}</h1><p id=\"price\">Price: {esc(dollars(p['price_cents']))}</p>"
                f"<p>SKU: {esc(sku)}</p><p>Rating: {p['rating']} out of 5 ({p['review_count']} reviews)</p>"
                f"<p>{esc(stock)}</p><p>{esc(p['description'])}</p>{add}")
        return page(p["name"], nav(request, db), body)


@router.post("/cart/add")
async def cart_add(request: Request) -> Response:
    fields = await form_fields(request)
    qty = max(1, min(99, as_int(fields.get("qty"), 1)))
    with session_db(request) as db:
        if db.execute("SELECT 1 FROM products WHERE sku = ?", (fields.get("sku", ""),)).fetchone():
            db.execute("INSERT INTO cart VALUES (?, ?) ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty",
                       (fields["sku"], qty))
    return redirect(request, "/shop/cart")


@router.post("/cart/remove")
async def cart_remove(request: Request) -> Response:
    fields = await form_fields(request)
    with session_db(request) as db:
        db.execute("DELETE FROM cart WHERE sku = ?", (fields.get("sku", ""),))
    return redirect(request, "/shop/cart")


def cart_lines(db: sqlite3.Connection) -> list[sqlite3.Row]:
    return db.execute("SELECT p.sku, p.name, p.price_cents, c.qty FROM cart c JOIN products p ON p.sku = c.sku "
                      "ORDER BY p.name").fetchall()


@router.get("/cart")
async def cart(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        lines = cart_lines(db)
        if not lines:
            return page("Shopping Cart", nav(request, db), "<h1>Shopping Cart</h1><p>Your cart is empty.</p>")
        rows = [[link(request, f"/shop/product/{line['sku']}", line["name"]), esc(dollars(line["price_cents"])),
                 f'<span class="qty">{line["qty"]}</span>', esc(dollars(line["price_cents"] * line["qty"])),
                 button_form(request, "/shop/cart/remove", "Remove", {"sku": line["sku"]})] for line in lines]
        total = sum(line["price_cents"] * line["qty"] for line in lines)
        body = ("<h1>Shopping Cart</h1>" + table(["Product", "Price", "Qty", "Subtotal", ""], rows,
                                                 [f' data-sku="{esc(line["sku"])}"' for line in lines])
                + f"<p>Cart subtotal: {esc(dollars(total))}</p>"
                + link(request, "/shop/checkout", "Proceed to Checkout"))
        return page("Shopping Cart", nav(request, db), body)


@router.get("/checkout")
async def checkout(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        if not cart_lines(db):
            return page("Checkout", nav(request, db), "<h1>Checkout</h1><p>Your cart is empty.</p>")
        address = db.execute("SELECT address FROM orders WHERE customer_id = ? ORDER BY id LIMIT 1",
                             (SESSION_CUSTOMER_ID,)).fetchone()["address"]
        methods = "".join(
            f'<label><input type="radio" name="shipping" value="{name}"{" checked" if name == "standard" else ""}> '
            f"{name.title()} shipping ({dollars(cents)})</label><br>" for name, cents in SHIPPING_CENTS.items())
        body = (f'<h1>Checkout</h1><form method="post" action="{esc(url(request, "/shop/checkout"))}">'
                f'<label>Shipping address <input type="text" name="address" value="{esc(address)}" size="40"></label>'
                f"<fieldset><legend>Shipping method</legend>{methods}</fieldset><button>Place Order</button></form>")
        return page("Checkout", nav(request, db), body)


@router.post("/checkout")
async def place_order(request: Request) -> Response:
    fields = await form_fields(request)
    shipping = fields.get("shipping", "standard") if fields.get("shipping") in SHIPPING_CENTS else "standard"
    with session_db(request) as db:
        lines = cart_lines(db)
        if not lines:
            return redirect(request, "/shop/cart")
        order_id = db.execute("SELECT MAX(id) + 1 FROM orders").fetchone()[0]
        total = sum(line["price_cents"] * line["qty"] for line in lines) + SHIPPING_CENTS[shipping]
        db.execute("INSERT INTO orders VALUES (?, ?, date('now'), 'pending', ?, ?, ?)",
                   (order_id, SESSION_CUSTOMER_ID, shipping, fields.get("address", "").strip(), total))
        db.executemany("INSERT INTO order_items VALUES (?, ?, ?, ?)",
                       [(order_id, line["sku"], line["qty"], line["price_cents"]) for line in lines])
        db.execute("DELETE FROM cart")
    return redirect(request, f"/shop/orders/{order_id}?placed=1")


@router.get("/orders")
async def orders(request: Request) -> HTMLResponse:
    with session_db(request) as db:
        rows = db.execute("SELECT * FROM orders WHERE customer_id = ? ORDER BY id DESC", (SESSION_CUSTOMER_ID,))
        cells = [[esc(f"#{o['id']}"), esc(o["created"]), esc(o["status"]), esc(dollars(o["total_cents"])),
                  link(request, f"/shop/orders/{o['id']}", f"View order #{o['id']}")] for o in rows]
        body = "<h1>My Orders</h1>" + table(["Order", "Date", "Status", "Total", ""], cells)
        return page("My Orders", nav(request, db), body)


@router.get("/orders/{order_id}")
async def order(request: Request, order_id: int, placed: int = 0) -> HTMLResponse:
    with session_db(request) as db:
        o = db.execute("SELECT * FROM orders WHERE id = ? AND customer_id = ?",
                       (order_id, SESSION_CUSTOMER_ID)).fetchone()
        if o is None:
            return page("Not found", nav(request, db), "<h1>Order not found</h1>")
        items = db.execute("SELECT p.name, i.qty, i.price_cents FROM order_items i JOIN products p ON p.sku = i.sku "
                           "WHERE i.order_id = ?", (order_id,)).fetchall()
        thanks = f"<p>Thank you for your order! Your order number is #{order_id}.</p>" if placed else ""
        body = (f"<h1>Order #{order_id}</h1>{thanks}<p>Status: {esc(o['status'])}</p><p>Date: {esc(o['created'])}</p>"
                f"<p>Ship to: {esc(o['address'])} ({esc(o['shipping'])} shipping)</p>"
                + table(["Product", "Qty", "Price"], [[esc(i["name"]), str(i["qty"]), esc(dollars(i["price_cents"]))]
                                                     for i in items])
                + f"<p>Order total: {esc(dollars(o['total_cents']))}</p>")
        return page(f"Order #{order_id}", nav(request, db), body)
